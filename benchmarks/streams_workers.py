"""Thousands of keyed streams at token rate through ``payonce serve --workers 2`` on Redis.

Issue 33's last figure: 5,000 concurrent streams at 10 tokens a second, all
complete, with the gateway's CPU per event (supervisor and workers) and
redis-server's, and the p99 gap between a stream's events against the same
load sent straight to the simulator right after::

    .venv/bin/python benchmarks/streams_workers.py                # 5,000 x 10/s, 100 tokens
    .venv/bin/python benchmarks/streams_workers.py --streams 500 --tokens 20   # a quick look

It starts a redis-server of its own (no persistence) on a free port, ``payonce
sim --latency fixed:0`` and the gateway, then ``--loaders`` processes of
``benchmarks/peers_load.py`` share the streams (one connection each, started at
``--rate`` a second in all, gaps noted). Nothing is pinned: the workers, the
simulator, Redis and the load generators share the machine's cores, as a
deployment of ``--workers 2`` on a small machine would. CPU is read from /proc
(the gateway's supervisor and its workers; redis-server apart), divided by the
``data:`` lines the clients received. The gaps of each load process are its
own quantiles; the row shows their range.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from gateway_overhead import cpu_us  # noqa: E402
from peers import run_jobs  # noqa: E402


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(url: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop_all(processes: list[subprocess.Popen[bytes]], work: Path) -> None:
    """Stop ``processes``, last started first (killed after 60 s), and remove ``work``."""
    for process in reversed(processes):
        process.terminate()
    for process in processes:
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
    shutil.rmtree(work, ignore_errors=True)


def _jobs(url: str, keyed: bool, options: argparse.Namespace) -> list[dict[str, Any]]:
    body = {
        "model": "gpt-4o-mini",
        # The simulator answers a prompt's length in tokens, capped by max_tokens.
        "messages": [{"role": "user", "content": "tok " * options.tokens}],
        "max_tokens": options.tokens,
        "stream": True,
    }
    headers = {
        "Authorization": "Bearer sk-streams-workers",
        "Content-Type": "application/json",
        "X-Sim-Token-Ms": str(1000 // options.token_rate),
        "X-Sim-Delay-Ms": "0",
    }
    jobs = []
    for part in range(options.loaders):
        count = options.streams // options.loaders + (part < options.streams % options.loaders)
        jobs.append(
            {
                "kind": "calls",
                "url": url + "/v1/chat/completions",
                "headers": headers,
                "body": json.dumps(body),
                "count": count,
                "rate": options.rate / options.loaders,
                "timeout": 120 + options.tokens / options.token_rate * 4,
                "key_prefix": f"sw-{uuid.uuid4().hex[:8]}-{part}" if keyed else "",
                "gaps": True,
            }
        )
    return jobs


def _row(documents: list[dict[str, Any]]) -> dict[str, Any]:
    results = [result for document in documents for result in document["results"]]
    answered = sum(1 for r in results if r[0] == 200 and not r[3] and r[1] is not None)
    gaps = [document["gaps"] for document in documents]
    return {
        "streams": len(results),
        "answered": answered,
        "events": sum(int(document.get("events") or 0) for document in documents),
        "gap_p50_ms": [g["p50_ms"] for g in gaps],
        "gap_p99_ms": [g["p99_ms"] for g in gaps],
        "gap_max_ms": [g["max_ms"] for g in gaps],
    }


def _span(values: list[float | None]) -> str:
    found = [value for value in values if value is not None]
    if not found:
        return "-"
    low, high = min(found), max(found)
    return f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}-{high:.0f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=5000, help="concurrent streams")
    parser.add_argument("--token-rate", type=int, default=10, help="tokens a second a stream")
    parser.add_argument("--tokens", type=int, default=100, help="tokens a stream (16 to 1,024)")
    parser.add_argument("--workers", type=int, default=2, help="payonce serve --workers N")
    parser.add_argument("--loaders", type=int, default=2, help="load generator processes")
    parser.add_argument("--rate", type=float, default=2000, help="streams started a second")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    options = parser.parse_args(argv)
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise SystemExit("redis-server is required (apt-get install -y redis-server)")
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="payonce-streams-workers-"))
    redis_port, sim_port, gateway_port = _port(), _port(), _port()
    processes: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], log: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=(work / log).open("wb"), cwd=work
        )
        processes.append(process)
        return process

    try:
        redis = start(
            [redis_server, "--port", str(redis_port), "--save", "", "--appendonly", "no"],
            "redis.log",
        )
        sim = start(
            [python, "-m", "payonce", "sim", "--port", str(sim_port), "--latency", "fixed:0"],
            "sim.log",
        )
        sim_url = f"http://127.0.0.1:{sim_port}"
        _ready(sim_url + "/_sim/health", sim)
        gateway = start(
            [python, "-m", "payonce", "serve", "--upstream", sim_url, "--port", str(gateway_port),
             "--store", f"redis://127.0.0.1:{redis_port}/0", "--workers", str(options.workers),
             "--no-otel", "--log-level", "warning"],
            "gateway.log",
        )  # fmt: skip
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        _ready(gateway_url + "/_payonce/health", gateway)
        gateway_cpu, redis_cpu = cpu_us(gateway.pid), cpu_us(redis.pid)
        payonce = _row(run_jobs(_jobs(gateway_url, True, options), work, pin=False))
        events = max(1, payonce["events"])
        payonce["gateway_cpu_us_per_event"] = (cpu_us(gateway.pid) - gateway_cpu) / events
        payonce["redis_cpu_us_per_event"] = (cpu_us(redis.pid) - redis_cpu) / events
        direct = _row(run_jobs(_jobs(sim_url, False, options), work, pin=False))
    finally:
        stop_all(processes, work)
    load = os.getloadavg()[0]
    print(
        f"# {options.streams} keyed streams x {options.token_rate}/s, {options.tokens} tokens,"
        f" --workers {options.workers}, Redis; load average {load:.2f}"
    )
    print(
        f"payonce: {payonce['answered']}/{payonce['streams']} answered,"
        f" {payonce['events']} events ({payonce['events'] / max(1, payonce['answered']):.0f}"
        f" a stream), {payonce['gateway_cpu_us_per_event']:.1f} us gateway CPU"
        f" + {payonce['redis_cpu_us_per_event']:.1f} us redis-server per event,"
        f" gap p50/p99/max {_span(payonce['gap_p50_ms'])} / {_span(payonce['gap_p99_ms'])}"
        f" / {_span(payonce['gap_max_ms'])} ms"
    )
    print(
        f"direct:  {direct['answered']}/{direct['streams']} answered, gap p50/p99/max"
        f" {_span(direct['gap_p50_ms'])} / {_span(direct['gap_p99_ms'])}"
        f" / {_span(direct['gap_max_ms'])} ms"
    )
    if options.json is not None:
        options.json.write_text(json.dumps({"payonce": payonce, "direct": direct}, indent=2))


if __name__ == "__main__":
    main()
