"""Instructions the metrics add to a keyed first call, in memory and shared (``--workers``).

In-process, under callgrind: the observer's calls of one keyed first call (start,
a keyed run starting, its upstream call counted, the request answered) repeated
``--small`` and ``--large`` times; the difference is divided by the extra calls,
so start-up cancels out. Only the bookkeeping is counted, no HTTP, no store, so
the figure isolates what shared metrics cost over in-memory ones::

    python benchmarks/metrics_instructions.py            # about a minute; needs valgrind

``--loop N`` (internal) runs the loop itself, ``--shared`` with a multiprocess directory.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile

from payonce.clock import ManualClock
from payonce.gateway.observing import Observer, UpstreamFacts
from payonce.observe.metrics import Metrics


def loop(count: int, shared: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="payonce-metrics-") as directory:
        run(count, Metrics(directory if shared else None))


def run(count: int, metrics: Metrics) -> None:
    runs: dict[str, int] = {}
    metrics.count_runs(runs)
    observer = Observer(metrics, None, ManualClock())
    for _ in range(count):
        record = observer.start("POST", "/v1/chat/completions", "t", [])
        runs["k"] = 1
        if metrics.shared:  # as Gateway._execute
            metrics.runs_changed()
        facts = UpstreamFacts(status=200, model="gpt-4o-mini", cost_usd=0.25, latency=0.02)
        facts.usage = {"input_tokens": 3, "output_tokens": 4}
        del runs["k"]
        observer.upstream_call(facts, "/v1/chat/completions")
        record.outcome, record.status, record.key = "forwarded", 200, "k"
        record.upstream_latency = 0.02
        observer.finish(record)


def instructions(count: int, shared: bool) -> int:
    command = [sys.executable, __file__, "--loop", str(count)] + (["--shared"] if shared else [])
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(done.stderr)
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--large", type=int, default=12000)
    parser.add_argument("--loop", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop is not None:
        loop(args.loop, args.shared)
        return
    extra = args.large - args.small
    per = {
        shared: (instructions(args.large, shared) - instructions(args.small, shared)) / extra
        for shared in (False, True)
    }
    print(
        f"metrics of one keyed first call: in memory {per[False]:,.0f} instructions,"
        f" shared {per[True]:,.0f} (+{per[True] - per[False]:,.0f})"
    )


if __name__ == "__main__":
    main()
