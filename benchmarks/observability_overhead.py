"""What do the call log, the metrics and tracing cost? payonce with them on versus off.

Uses the machinery of ``gateway_overhead.py`` (same simulator, wrk loads, pinning and
CPU accounting) on two gateways in one run:

* **off**: ``--no-metrics --no-otel`` and no call log;
* **on**: ``--call-log FILE`` (a real file on the same disk), metrics, and tracing
  through opentelemetry-api when it is installed (no SDK configured: a no-op tracer,
  as in a deployment that has not set up an exporter).

For the no-key pass-through and the keyed first call (SQLite), it reports requests/s
and gateway CPU µs per request, and the throughput lost with observability on.
Target: under 10% loss. CPU per request is the steadier figure on a shared machine.

Usage::

    .venv/bin/python benchmarks/observability_overhead.py            # about 80 s
    .venv/bin/python benchmarks/observability_overhead.py --quick    # smoke run
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_overhead import (
    Bench,
    Load,
    Measurement,
    Pinning,
    Service,
    Target,
    ensure_binary,
    free_port,
    parse_args,
    payonce_command,
    start_service,
    wait_ready,
)


@contextlib.contextmanager
def gateway(bench: Bench, name: str, flags: Sequence[str]) -> Iterator[tuple[Service, str]]:
    port = free_port()
    command = [
        *payonce_command(),
        "serve",
        "--upstream",
        bench.sim_url,
        "--store",
        f"sqlite:///{bench.workdir}/{name}.db",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *flags,
    ]
    service = start_service(name, Pinning.wrap(bench.pinning.under_test, command), bench.workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(service, f"{url}/_payonce/health")
        yield service, url
    finally:
        service.stop()


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    wrk = ensure_binary("wrk", ["wrk"], options.install)
    if wrk is None:
        print("wrk is required (apt-get install -y wrk)", file=sys.stderr)
        return 1
    results: dict[tuple[str, str], Measurement] = {}
    with tempfile.TemporaryDirectory(prefix="payonce-obs-bench-") as tmp:
        workdir = Path(tmp)
        bench = Bench(options, wrk, workdir, Pinning.for_machine(options.pin))
        print(f"# pinning: {bench.pinning.describe()}")
        bench.start_sim()
        try:
            variants = {
                "off": ["--no-metrics", "--no-otel"],
                "on": ["--call-log", str(workdir / "calls.jsonl")],
            }
            for variant, flags in variants.items():
                with gateway(bench, f"gateway-{variant}", flags) as (service, url):
                    for kind, label in (("nokey", "no key"), ("first", "keyed first call")):
                        target = Target(
                            f"{kind}-{variant}", f"{label}, observability {variant}", url,
                            Load(kind), service,
                        )  # fmt: skip
                        results[(kind, variant)] = bench.measure(target)
        finally:
            assert bench.sim is not None
            bench.sim.stop()
        lines = (workdir / "calls.jsonl").read_bytes().count(b"\n")
    print(
        "\n| path | off: req/s | on: req/s | throughput lost | off: CPU µs/req | on: CPU µs/req |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for kind, label in (("nokey", "no key"), ("first", "keyed first call (SQLite)")):
        off, on = results[(kind, "off")], results[(kind, "on")]
        lost = 1 - on.rps / off.rps if off.rps else float("nan")
        verdict = "PASS" if lost < 0.10 else "MISS"
        print(
            f"| {label} | {off.rps:,.0f} | {on.rps:,.0f} | {lost:.1%} ({verdict} < 10%) |"
            f" {off.proxy_cpu_us or 0:.0f} | {on.proxy_cpu_us or 0:.0f} |"
        )
    print(f"\ncall log lines written with observability on: {lines:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
