"""How long ``payonce simulate`` takes for 1,000,000 business requests (target: < 5 s).

Times the vectorised Monte Carlo (:func:`payonce.simulate.model.simulate`) on the
demo's configuration (lognormal p50=4s p99=30s, timeout 10 s, 2 app attempts with
300 ms backoff, 2 SDK retries, a proxy with 8 s timeout and 1 retry), without and
with payonce, and compares it with two baselines measured in the same run:

* NumPy drawing 1,000,000 log-normal latencies and nothing else: the floor;
* the same model written as a plain Python loop, one request at a time, over
  ``--python-requests`` requests and scaled to 1,000,000 (also an independent
  check of the duplicate ratio).

Finally the whole command, ``payonce simulate ... --json`` in a fresh process
(imports included). The load average is printed: other work on the machine slows
every row alike. Results are recorded in benchmarks/NOTEBOOK.md ("payonce simulate speed").

    .venv/bin/python benchmarks/simulate_speed.py [--requests 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from payonce.simulate.closed_form import closed_form
from payonce.simulate.config import Backoff, ProxyConfig, StackConfig
from payonce.simulate.latency import LogNormalDistribution
from payonce.simulate.model import simulate
from payonce.simulate.report import figures

LATENCY = LogNormalDistribution(4.0, 30.0)
DEMO = StackConfig(
    latency=LATENCY,
    timeout=10.0,
    app_attempts=2,
    app_backoff=Backoff(0.3, 0.3, multiplier=1.0),
    sdk_retries=2,
    proxy=ProxyConfig(timeout=8.0, retries=1),
)
FLAGS = [
    "--latency", "lognormal:p50=4s,p99=30s", "--timeout", "10s", "--app-attempts", "2",
    "--app-backoff", "300ms", "--sdk-retries", "2", "--proxy-timeout", "8s", "--proxy-retries", "1",
]  # fmt: skip


def best_of(repeat: int, work: Callable[[], object]) -> float:
    """The fastest of ``repeat`` runs, in seconds (the least disturbed by other load)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def python_loop(requests: int, seed: int) -> tuple[int, int]:
    """The demo's stack without payonce, one request at a time: (billed, duplicates)."""
    rng = random.Random(seed)
    mu, sigma = LATENCY.mu, LATENCY.sigma
    billed_total = duplicates = 0
    for _ in range(requests):
        billed = 0
        for _app in range(2):
            answered = False
            for _sdk in range(3):
                # One SDK attempt: the proxy's first try, and a second at 8 s if the
                # first has not answered by then (the client still waits until 10 s).
                first = rng.lognormvariate(mu, sigma)
                billed += 1
                if first <= 8.0:
                    answered = True
                    break
                second = rng.lognormvariate(mu, sigma)
                billed += 1
                if 8.0 + second <= 10.0:
                    answered = True
                    break
            if answered:
                break
        billed_total += billed
        duplicates += billed - 1
    return billed_total, duplicates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--python-requests", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.requests
    print(f"load average before: {_load()}, nproc {os.cpu_count()}")

    simulate(DEMO, 10_000, seed=0)  # warm up NumPy's code paths
    rng = np.random.default_rng(1)
    floor = best_of(args.repeat, lambda: rng.lognormal(LATENCY.mu, LATENCY.sigma, n))
    without = best_of(args.repeat, lambda: simulate(DEMO, n, seed=1))
    with_payonce = best_of(args.repeat, lambda: simulate(replace(DEMO, payonce=True), n, seed=1))
    start = time.perf_counter()
    billed, duplicates = python_loop(args.python_requests, seed=1)
    loop = (time.perf_counter() - start) * n / args.python_requests

    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "payonce",
            "simulate",
            *FLAGS,
            "--requests",
            str(n),
            "--seed",
            "1",
            "--json",
        ],
        check=True,
        capture_output=True,
    )
    command = time.perf_counter() - start

    result = figures(simulate(DEMO, n, seed=1))
    exact = closed_form(DEMO)
    assert exact is not None
    print(f"{n:,} business requests, demo stack, best of {args.repeat}:")
    print(f"  NumPy: {n:,} log-normal draws only       {floor:7.3f} s")
    for name, seconds in (("without payonce", without), ("with payonce", with_payonce)):
        print(f"  simulate, {name:31s}{seconds:7.3f} s  ({seconds / floor:.1f}x the draws)")
    print(
        f"  plain Python loop ({args.python_requests:,}, scaled)    {loop:7.3f} s"
        f"  (simulate is {loop / without:.0f}x faster)"
    )
    print(f"  payonce simulate --json, whole command   {command:7.3f} s  (both models, imports)")
    verdict = "PASS" if command < 5 else "MISS"
    print(f"target: 1M business requests in under 5 s: {verdict}")
    print(
        f"duplicate ratio: simulate {result.duplicate_ratio:.4f}, Python loop"
        f" {duplicates / billed:.4f}, closed form {exact.duplicate_ratio:.4f}"
    )
    print(f"load average after: {_load()}")
    if not math.isclose(result.duplicate_ratio, exact.duplicate_ratio, abs_tol=0.02):
        sys.exit("the Monte Carlo disagrees with the closed form")


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


if __name__ == "__main__":
    main()
