"""The SQLite store with thousands of streams in flight (issue 19, workload 4).

``N`` streams each append one event a second to one SQLite store, as the gateway
records them, while a probe claims a new key every 10 ms and their leases are
renewed by the gateway's own loop (:func:`payonce.gateway.execution.renew_leases`,
here every ``--renew-every`` seconds). Measured for each tree of sources given
(``--src``, e.g. an export of main beside this worktree's ``src``), in interleaved
rounds, each in its own process: the process's CPU seconds, the bytes it wrote to
the disk (``/proc/self/io``), and the probe claims' latency (p50, p99, max)::

    git archive main src | tar -x -C .scratch/main
    .venv/bin/python benchmarks/sqlite_in_flight.py --src .scratch/main/src --src src

Ratios are against the first ``--src``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


async def child(streams: int, seconds: float, renew_every: float) -> dict[str, Any]:
    from payonce.gateway.execution import Execution, renew_leases
    from payonce.store import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="payonce-inflight-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "p.db"))
        claims = await asyncio.gather(
            *(store.claim("t", f"s{i}", "fp", lease=30, ttl=600) for i in range(streams))
        )
        tokens = [c.record.token for c in claims]
        await asyncio.gather(
            *(store.begin_stream("t", f"s{i}", tokens[i], 200, ()) for i in range(streams))
        )
        running = {
            ("t", f"s{i}"): Execution("t", f"s{i}", token, "fp", 0.0)
            for i, token in enumerate(tokens)
        }
        event = b'data: {"choices":[{"delta":{"content":"token"}}]}\n\n'
        stop = time.monotonic() + seconds

        async def stream(i: int) -> None:
            await asyncio.sleep(i / streams)  # spread over the second, as starts are
            seq = 1
            while time.monotonic() < stop:
                await store.append_events("t", f"s{i}", tokens[i], seq, [event])
                seq += 1
                await asyncio.sleep(1.0)

        latencies: list[float] = []

        async def probe() -> None:
            n = 0
            while time.monotonic() < stop:
                began = time.perf_counter()
                await store.claim("t", f"probe{n}", "fp", lease=30, ttl=600)
                latencies.append(time.perf_counter() - began)
                n += 1
                await asyncio.sleep(0.01)

        cpu, written = time.process_time(), _write_bytes()
        renewing = asyncio.ensure_future(renew_leases(store, running, renew_every * 3))
        await asyncio.gather(probe(), *(stream(i) for i in range(streams)))
        renewing.cancel()
        cpu, written = time.process_time() - cpu, _write_bytes() - written
        await store.close()
    latencies.sort()
    return {
        "cpu_s": cpu,
        "written_mib": written / 2**20,
        "claim_p50_ms": statistics.median(latencies) * 1000,
        "claim_p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "claim_max_ms": latencies[-1] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", action="append", default=[], help="a src/ tree (repeat)")
    parser.add_argument("--streams", type=int, default=2500)
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--renew-every", type=float, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = asyncio.run(child(args.streams, args.seconds, args.renew_every))
        print(json.dumps(result))
        return 0
    sources = args.src or ["src"]
    rows: dict[str, list[dict[str, Any]]] = {src: [] for src in sources}
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    for number in range(args.rounds):
        for src in sources:
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            command = [sys.executable, __file__, "--child", f"--streams={args.streams}"]
            command += [f"--seconds={args.seconds}", f"--renew-every={args.renew_every}"]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout)
            rows[src].append(row)
            shown = ", ".join(f"{k} {v:.1f}" for k, v in row.items())
            print(f"# round {number + 1} {src}: {shown}", flush=True)
    print(f"# load average at end: {os.getloadavg()}")
    base = {k: statistics.median(r[k] for r in rows[sources[0]]) for k in rows[sources[0]][0]}
    for src in sources:
        med = {k: statistics.median(r[k] for r in rows[src]) for k in rows[src][0]}
        shown = ", ".join(f"{k} {v:.1f} ({v / base[k]:.2f}x)" for k, v in med.items())
        print(f"{src}: {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
