"""How far behind a follower on another gateway sees a live stream's events.

Two gateways share one store (an SQLite file, or a Redis of this script's own),
both in front of one ``payonce sim``. A client streams a keyed call through
gateway A at ``--token-rate`` tokens a second; ``--join`` seconds later a
second client sends the same call, with the same key, through gateway B, which
follows the run A records. Each event carries its number (``id: N-<run>``), so
its arrival at both clients can be compared: the lag is B's arrival minus A's,
for the events A received after B joined. Reported for the first second after
the join (the writer may not know of the follower yet) and for the rest, as
median, p99 and max over ``--streams`` streams, one after another::

    .venv/bin/python benchmarks/follower_lag.py                       # SQLite and Redis
    .venv/bin/python benchmarks/follower_lag.py --base-src /tmp/base  # and a baseline's sources

With ``--base-src DIR`` each store is measured with this checkout's sources and
then with ``DIR/src`` (``git worktree add DIR REV``), in the same run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from streams_workers import _port, _ready, stop_all  # noqa: E402


def _stream(port: int, key: str, tokens: int, token_ms: int, arrivals: dict[int, float]) -> None:
    """One streamed call; each event's arrival by its number."""
    body = json.dumps(
        {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "tok " * tokens}],
            "max_tokens": tokens,
            "stream": True,
        }
    )
    headers = {
        "Authorization": "Bearer sk-follower-lag",
        "Content-Type": "application/json",
        "Idempotency-Key": key,
        "X-Sim-Token-Ms": str(token_ms),
    }
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"the gateway answered {response.status}: {response.read()[:300]!r}")
    while line := response.readline():
        if line.startswith(b"id: "):
            arrivals[int(line[4:].split(b"-", 1)[0])] = time.monotonic()
    connection.close()


def _quantiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.median(ordered) * 1000:.0f} / {p99 * 1000:.0f} / {ordered[-1] * 1000:.0f}"


def measure(store: str, src: Path, options: argparse.Namespace) -> dict[str, list[float]]:
    """Lags (seconds) in the first second after the join and after it, over all streams."""
    work = Path(tempfile.mkdtemp(prefix="payonce-lag-"))
    env = {**os.environ, "PYTHONPATH": str(src)}
    python = sys.executable
    processes: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], log: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=(work / log).open("wb"), cwd=work, env=env
        )
        processes.append(process)
        return process

    lags: dict[str, list[float]] = {"join": [], "after": [], "missing": []}
    try:
        if store == "redis":
            redis_port = _port()
            redis_server = shutil.which("redis-server") or "/usr/bin/redis-server"
            start(
                [redis_server, "--port", str(redis_port), "--save", "", "--appendonly", "no"],
                "redis.log",
            )
            url = f"redis://127.0.0.1:{redis_port}/0"
        else:
            url = f"sqlite:///{work}/shared.db"
        sim_port = _port()
        sim = start(
            [python, "-m", "payonce", "sim", "--port", str(sim_port), "--latency", "fixed:0"],
            "sim.log",
        )
        _ready(f"http://127.0.0.1:{sim_port}/_sim/health", sim)
        ports = []
        for name in ("a", "b"):
            port = _port()
            gateway = start(
                [python, "-m", "payonce", "serve", "--upstream", f"http://127.0.0.1:{sim_port}",
                 "--port", str(port), "--store", url, "--no-otel", "--log-level", "warning"],
                f"gateway-{name}.log",
            )  # fmt: skip
            _ready(f"http://127.0.0.1:{port}/_payonce/health", gateway)
            ports.append(port)
        token_ms = 1000 // options.token_rate
        for _ in range(options.streams):
            key = f"lag-{uuid.uuid4().hex}"
            first: dict[int, float] = {}
            second: dict[int, float] = {}
            owner = threading.Thread(
                target=_stream, args=(ports[0], key, options.tokens, token_ms, first)
            )
            owner.start()
            time.sleep(options.join)
            joined = time.monotonic()
            _stream(ports[1], key, options.tokens, token_ms, second)
            owner.join()
            # Every event the first client got, the follower got too (by number).
            lags["missing"] += [float(n) for n in sorted(set(first) - set(second))]
            for number, at in first.items():
                if at > joined and number in second:
                    kind = "join" if at - joined < 1.0 else "after"
                    lags[kind].append(max(0.0, second[number] - at))
    finally:
        stop_all(processes, work)
    return lags


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="sqlite,redis", help="sqlite, redis or both")
    parser.add_argument("--streams", type=int, default=10, help="streams, one after another")
    parser.add_argument("--tokens", type=int, default=40, help="tokens a stream")
    parser.add_argument("--token-rate", type=int, default=10, help="tokens a second")
    parser.add_argument("--join", type=float, default=0.5, help="seconds before B's client")
    parser.add_argument("--base-src", type=Path, default=None, help="a baseline's checkout")
    parser.add_argument("--json", type=Path, default=None, help="also write the lags here")
    options = parser.parse_args(argv)
    rows: dict[str, dict[str, list[float]]] = {}
    sides = [("this", ROOT / "src")]
    if options.base_src is not None:
        sides.append(("base", options.base_src.resolve() / "src"))
    print(
        f"# a follower on another gateway: {options.streams} streams of {options.tokens}"
        f" tokens at {options.token_rate}/s, joined after {options.join:g} s;"
        " lag in ms, p50 / p99 / max"
    )
    for store in options.stores.split(","):
        for name, src in sides:
            lags = measure(store, src, options)
            rows[f"{store}-{name}"] = lags
            print(
                f"{store:6} {name:4}  first second after the join: {_quantiles(lags['join'])}"
                f" ({len(lags['join'])} events);  after it: {_quantiles(lags['after'])}"
                f" ({len(lags['after'])} events)"
            )

    if options.json is not None:
        options.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
