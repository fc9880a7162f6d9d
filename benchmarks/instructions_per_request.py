"""Instructions per request of the gateway under callgrind, this checkout against a baseline.

Counts instructions, not seconds: the same for the same code whatever else the
machine does, so two checkouts can be compared on a busy machine. Each gateway
runs under ``valgrind --tool=callgrind`` in front of ``payonce sim`` (zero
latency, SQLite store); one keep-alive connection sends requests one after the
other. Each checkout runs twice, with ``--small`` and ``--large`` requests, and
the difference is divided by the extra requests, so start-up and shutdown cancel
out::

    python benchmarks/instructions_per_request.py --base ../payonce-7ac5440
    python benchmarks/instructions_per_request.py --base ../old --kind plain
    python benchmarks/instructions_per_request.py --base ../old --workers 2 --call-log

A checkout is a payonce source tree with its own ``.venv`` (``make .venv/.installed``);
``--base-src DIR`` instead runs the baseline's sources (``DIR/src``, for example
from ``git worktree add DIR REV``) with this checkout's ``.venv``::

    python benchmarks/instructions_per_request.py --base-src /tmp/base --kind event,plain-event

``--kind`` picks what each request is, one or several (comma-separated; default
keyed, plain and replay): ``keyed`` a new Idempotency-Key per request (the keyed
first call), ``plain`` none (pass-through), ``replay`` one of ``REPLAY_KEYS``
keys completed beforehand, in turn (the warm-up calls are the same in both runs,
so they cancel out too), ``stream`` a new key per streamed request. Per stream
*event* instead of per request: ``event`` (keyed) and ``plain-event`` (no key)
send ``EVENT_STREAMS`` streams one after the other, paced one token per 5 ms
(each event its own read, as at token rate), of ``--small`` and then ``--large``
tokens each (defaults for these kinds: 20 and 220); the difference, divided by
the extra events, is what one more event costs, the streams' own costs
cancelled out. ``--workers N`` runs
``payonce serve --workers N`` and counts every process (supervisor and workers;
callgrind follows the forks, one output file each); the one connection is
served by one worker, the others idle. ``--call-log`` writes the call log to a
file in the run's directory. ``--rounds R`` measures base and new R times,
alternating, and reports each.
``--base-flags`` and ``--new-flags`` add ``serve`` flags to one side, so one
checkout can be compared with itself, with and without a feature::

    python benchmarks/instructions_per_request.py --base . --new-flags \
        "--max-inflight-per-tenant 64 --max-new-keys-per-tenant 1000000/s"

Needs valgrind. About a minute per checkout and round (two with ``--workers``).
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

KINDS = ("keyed", "plain", "replay", "stream", "event", "plain-event")
EVENT_KINDS = ("event", "plain-event")
EVENT_STREAMS = 4
EVENT_SIZES = (20, 220)  # tokens per stream in the small and the large run
REPLAY_KEYS = 50
BODY = json.dumps(
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
)
STREAM_BODY = json.dumps({**json.loads(BODY), "stream": True})


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(
    port: int, gateway: subprocess.Popen[bytes], log: Path, timeout: float = 300
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if gateway.poll() is not None:
            raise RuntimeError(f"the gateway exited with {gateway.returncode}: {log.read_text()}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("GET", "/_payonce/health")
            connection.getresponse().read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _send_all(
    connection: http.client.HTTPConnection,
    keys: list[str | None],
    body: str,
    extra: Mapping[str, str] | None = None,
) -> None:
    """One request per key (``None``: without one), one after the other."""
    for key in keys:
        headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
        headers.update(extra or {})
        if key is not None:
            headers["Idempotency-Key"] = key
        connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
        answer = connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"the gateway answered {answer.status}")


def total_instructions(
    checkout: Path,
    kind: str,
    requests: int,
    workers: int = 1,
    call_log: bool = False,
    flags: Sequence[str] = (),
    env: Mapping[str, str | None] | None = None,
) -> dict[str, int]:
    """Instructions the gateway of ``checkout`` ran, from start to stop, for ``requests``.

    ``flags``: more ``payonce serve`` flags; ``env``: variables set for the
    gateway (``None`` removes one).

    ``total`` sums its processes; with ``workers`` > 1 also ``supervisor``,
    ``serving`` (the worker that served the one connection: the busiest) and
    ``idle`` (the other workers, whose timers still tick once a second).
    """
    python = str(checkout / ".venv" / "bin" / "python")
    work = Path(tempfile.mkdtemp(prefix="payonce-callgrind-"))
    sim_port, gateway_port = _port(), _port()
    sim = subprocess.Popen(
        [python, "-m", "payonce", "sim", "--port", str(sim_port), "--latency", "fixed:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    serve = [python, "-m", "payonce", "serve", "--upstream", f"http://127.0.0.1:{sim_port}"]
    serve += ["--port", str(gateway_port), "--store", f"sqlite:///{work / 'payonce.db'}"]
    serve += ["--no-otel", "--log-level", "warning"]
    if workers > 1:
        serve += ["--workers", str(workers)]
    if call_log:
        serve += ["--call-log", str(work / "calls.jsonl")]
    serve += flags
    environment = dict(os.environ)
    # A fixed hash seed: with a random one, the same dict lookups probe differently
    # from run to run (string hashes change), a few thousand instructions an
    # event apart between two runs of the same code.
    environment["PYTHONHASHSEED"] = "0"
    for name, value in (env or {}).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    gateway = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/callgrind.%p", *serve],
        stdout=subprocess.DEVNULL,
        stderr=(work / "gateway.log").open("wb"),
        cwd=work,
        env=environment,
    )
    try:
        _wait_ready(gateway_port, gateway, work / "gateway.log")
        connection = http.client.HTTPConnection("127.0.0.1", gateway_port, timeout=60)
        nonce = uuid.uuid4().hex
        keys: list[str | None]
        if kind == "replay":
            keys = [f"r-{nonce}-{n}" for n in range(REPLAY_KEYS)]
            _send_all(connection, keys, BODY)  # their first calls, the same in both runs
            keys = [keys[n % REPLAY_KEYS] for n in range(requests)]
        elif kind in EVENT_KINDS:
            # ``requests`` is the tokens per stream: the simulator answers a
            # prompt's length in tokens, capped by max_tokens.
            body = json.dumps(
                {
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": "tok " * requests}],
                    "max_tokens": requests,
                    "stream": True,
                }
            )
            keyed = kind == "event"
            keys = [f"e-{nonce}-{n}" if keyed else None for n in range(EVENT_STREAMS)]
            _send_all(connection, keys, body, {"X-Sim-Token-Ms": "5"})
            keys = []
        elif kind in ("keyed", "stream"):
            keys = [f"k-{nonce}-{n}" for n in range(requests)]
        else:
            keys = [None] * requests
        _send_all(connection, keys, STREAM_BODY if kind == "stream" else BODY)
        connection.close()
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(300)
        sim.terminate()
        sim.wait()
    counts: dict[int, int] = {}  # pid -> instructions, one file per process
    for name in glob.glob(f"{work}/callgrind.*"):
        found = 0
        with open(name) as handle:
            for line in handle:
                if line.startswith(("summary:", "totals:")):
                    found = max(found, int(line.split()[1]))
        counts[int(name.rsplit(".", 1)[1])] = found
    shutil.rmtree(work, ignore_errors=True)
    parts = {"total": sum(counts.values())}
    if workers > 1:
        parts["supervisor"] = counts.pop(gateway.pid, 0)
        busiest = max(counts.values())
        parts["serving"] = busiest
        parts["idle"] = sum(counts.values()) - busiest
    return parts


def per_request(
    checkout: Path,
    kind: str,
    small: int,
    large: int,
    workers: int = 1,
    call_log: bool = False,
    flags: Sequence[str] = (),
    env: Mapping[str, str | None] | None = None,
) -> dict[str, float]:
    """Instructions per request (per event: :data:`EVENT_KINDS`), from the difference
    of a small and a large run."""
    low = total_instructions(checkout, kind, small, workers, call_log, flags, env)
    high = total_instructions(checkout, kind, large, workers, call_log, flags, env)
    extra = (large - small) * (EVENT_STREAMS if kind in EVENT_KINDS else 1)
    return {part: (high[part] - low[part]) / extra for part in high}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="the baseline checkout (with its .venv)")
    parser.add_argument(
        "--base-src",
        type=Path,
        help="instead: a baseline source tree run with this checkout's .venv"
        " (its src/ first on PYTHONPATH; `git worktree add DIR REV`)",
    )
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument(
        "--kind", default="keyed,plain,replay", help=f"{', '.join(KINDS)} (comma-separated)"
    )
    parser.add_argument("--small", type=int, default=None, help="200 (event kinds: 20)")
    parser.add_argument("--large", type=int, default=None, help="1000 (event kinds: 220)")
    parser.add_argument("--workers", type=int, default=1, help="payonce serve --workers N")
    parser.add_argument("--call-log", action="store_true", help="with a call log file")
    parser.add_argument("--rounds", type=int, default=1, help="base and new, alternating")
    parser.add_argument("--base-flags", default="", help="more serve flags for the base")
    parser.add_argument("--new-flags", default="", help="more serve flags for the new one")
    args = parser.parse_args()
    if (args.base is None) == (args.base_src is None):
        parser.error("give one of --base and --base-src")
    base_checkout = args.new.resolve() if args.base is None else args.base.resolve()
    base_env = {"PYTHONPATH": str(args.base_src.resolve() / "src")} if args.base_src else None
    kinds = [kind.strip() for kind in args.kind.split(",") if kind.strip()]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"--kind: unknown {', '.join(sorted(unknown))} (choose from {KINDS})")
    extra = f", --workers {args.workers}" + (", --call-log" if args.call_log else "")
    extra += f", base flags {args.base_flags!r}" if args.base_flags else ""
    extra += f", new flags {args.new_flags!r}" if args.new_flags else ""
    for round_ in range(1, args.rounds + 1):
        for kind in kinds:
            small, large = EVENT_SIZES if kind in EVENT_KINDS else (200, 1000)
            small, large = args.small or small, args.large or large
            options = (kind, small, large, args.workers, args.call_log)
            base = per_request(base_checkout, *options, tuple(args.base_flags.split()), base_env)
            new = per_request(args.new.resolve(), *options, tuple(args.new_flags.split()))
            print(
                f"{kind}{extra}, round {round_}: base {base['total'] / 1000:,.1f}k"
                f" instructions/{'event' if kind in EVENT_KINDS else 'request'},"
                f" new {new['total'] / 1000:,.1f}k,"
                f" ratio new/base {new['total'] / base['total']:.3f}",
                flush=True,
            )
            for part in ("serving", "idle", "supervisor"):
                if part in base:
                    print(
                        f"    {part}: base {base[part] / 1000:,.1f}k, new {new[part] / 1000:,.1f}k",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
