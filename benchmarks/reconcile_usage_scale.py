"""How ``payonce reconcile`` scales against a provider's usage report (aggregated buckets).

A year of hourly OpenAI usage buckets (8,760 x models x API keys results, the
Usage API's page objects, one page of 168 buckets per line, as ``--fetch --save``
writes them) against a call log of N calls, generated with a known truth:

- business request b lives in hour ``hash(b) % 8760`` of the year, on model
  ``b % 4`` and tenant ``b % 10`` (tenant t bills to API key ``key_t``); each call
  has 100 input and 20 output tokens at the model's list price;
- the first 90% of the calls are business requests of their own, each of the
  last 10% repeats an earlier one (a duplicate in the same hour);
- the report bills every call, plus one request (and its tokens) nobody logged in
  every (hour, model, key) whose number is divisible by 97: unexplained.

The figures of the run must equal that truth exactly, or the benchmark fails.

    .venv/bin/python benchmarks/reconcile_usage_scale.py --calls 100000000
    .venv/bin/python benchmarks/reconcile_usage_scale.py --calls 1000000 --format jsonl

``--format csv`` writes the generic calls CSV (with the optional upstream columns);
``jsonl`` writes the gateway's own call log (schema 2), about 4x larger per call.
Time is the whole command (interpreter start included), peak RSS is ``wait4``'s.
Before generating, it stops with one line when ``--dir`` has less free disk than
the data needs plus a fifth for DuckDB's spill. ``--keep`` keeps the data and
``--reuse DIR`` reconciles it again (the same ``--calls``) without generating it;
with ``PYTHONPATH`` pointing at another checkout's ``src``, that version runs on
the same data.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOURS = 8760
MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "gpt-4.1-nano")
TENANTS = 10
START = 1767225600  # 2026-01-01T00:00:00Z
PAGE_BUCKETS = 168  # the Usage API's largest page for 1h buckets
EXTRA_EVERY = 97
BYTES_PER_CALL = {"csv": 150, "jsonl": 520}  # measured at 1M, rounded up


def _calls_select(calls: int) -> str:
    unique = calls * 9 // 10
    return f"""
    SELECT j, CASE WHEN j < {unique} THEN j ELSE (j * 7919) % {unique} END AS b
    FROM range({calls}) t(j)
    """


def _call_columns() -> str:
    models = ", ".join(f"'{m}'" for m in MODELS)
    return f"""
    'order-' || b AS business_id, 'chatcmpl-' || j AS provider_request_id,
    [{models}][b % 4 + 1] AS model, '/v1/chat/completions' AS endpoint,
    'tenant' || (b % {TENANTS}) AS tag, 200 AS status,
    strftime(to_timestamp({START} + (hash(b) % {HOURS}) * 3600 + (j % 3600)),
             '%Y-%m-%dT%H:%M:%S.000Z') AS ts,
    200 AS upstream_status, 1 AS upstream_attempts, 100 AS input_tokens, 20 AS output_tokens
    """


def generate(directory: Path, calls: int, fmt: str) -> dict[str, object]:
    """Write the call log and the usage pages; return the truth."""
    import duckdb

    connection = duckdb.connect(config={"memory_limit": "4GiB"})
    connection.execute("SET preserve_insertion_order = false")
    log = directory / ("calls.csv" if fmt == "csv" else "calls.jsonl")
    if fmt == "csv":
        connection.execute(
            f"COPY (SELECT {_call_columns()} FROM ({_calls_select(calls)})) TO"
            f" '{log}' (FORMAT csv, HEADER true)"
        )
    else:
        connection.execute(
            f"COPY (SELECT 2 AS v, ts, 'r' || j AS request_id, business_id AS key,"
            " tag AS tenant, 'POST' AS method, endpoint AS path, model, false AS stream,"
            " 'forwarded' AS outcome, 200 AS status, false AS client_disconnected,"
            " upstream_status, provider_request_id AS upstream_request_id, upstream_attempts,"
            " false AS upstream_cancelled, false AS unprotected_retry, input_tokens,"
            " output_tokens, 0.0 AS cost_usd"
            f" FROM (SELECT j, {_call_columns()} FROM ({_calls_select(calls)})))"
            f" TO '{log}' (FORMAT json)"
        )
    groups = connection.execute(
        f"""SELECT hash(b) % {HOURS} AS hour, b % 4 AS model, b % {TENANTS} AS tenant,
                   count(*) AS n
            FROM ({_calls_select(calls)}) GROUP BY ALL"""
    ).fetchall()
    cells: dict[tuple[int, int, int], int] = {}
    for hour, model, tenant, n in groups:
        cells[(int(hour), int(model), int(tenant))] = int(n)
    for hour in range(HOURS):
        for model in range(len(MODELS)):
            for tenant in range(TENANTS):
                if (hour * 40 + model * 10 + tenant) % EXTRA_EVERY == 0:
                    cells[(hour, model, tenant)] = cells.get((hour, model, tenant), 0) + 1
    pages = directory / "openai-usage.jsonl"
    with pages.open("w") as out:
        for first in range(0, HOURS, PAGE_BUCKETS):
            buckets = []
            for hour in range(first, min(first + PAGE_BUCKETS, HOURS)):
                results = [
                    {
                        "object": "organization.usage.completions.result",
                        "input_tokens": 100 * n,
                        "output_tokens": 20 * n,
                        "input_cached_tokens": 0,
                        "num_model_requests": n,
                        "project_id": None,
                        "user_id": None,
                        "api_key_id": f"key_{tenant}",
                        "model": MODELS[model] + "-2026-01-01",
                        "batch": False,
                        "service_tier": "default",
                    }
                    for model in range(len(MODELS))
                    for tenant in range(TENANTS)
                    if (n := cells.get((hour, model, tenant), 0))
                ]
                start = START + hour * 3600
                buckets.append(
                    {"object": "bucket", "start_time": start, "end_time": start + 3600,
                     "results": results}
                )  # fmt: skip
            last = first + PAGE_BUCKETS >= HOURS
            page = {"object": "page", "data": buckets, "has_more": not last,
                    "next_page": None if last else f"page_{first + PAGE_BUCKETS}"}  # fmt: skip
            out.write(json.dumps(page) + "\n")
    keys = directory / "keys.json"
    # The tenant column of this synthetic log is the tenant id itself.
    keys.write_text(json.dumps({f"tenant{t}": f"key_{t}" for t in range(TENANTS)}))
    return truth_of(directory, calls, fmt)


def truth_of(directory: Path, calls: int, fmt: str) -> dict[str, object]:
    """The figures the run must find: they follow from the generator's formulas alone."""
    from payonce.observe.pricing import price_of

    extra = 0
    unexplained_cost = 0.0
    for hour in range(HOURS):
        for model in range(len(MODELS)):
            for tenant in range(TENANTS):
                if (hour * 40 + model * 10 + tenant) % EXTRA_EVERY == 0:
                    extra += 1
                    price = price_of(MODELS[model])
                    assert price is not None
                    unexplained_cost += (100 * price.input + 20 * price.output) / 1e6
    return {
        "calls": directory / ("calls.csv" if fmt == "csv" else "calls.jsonl"),
        "pages": directory / "openai-usage.jsonl",
        "keys": directory / "keys.json",
        "billed_requests": calls + extra,
        "duplicate_requests": calls - calls * 9 // 10,
        "unexplained_requests": extra,
        "unexplained_tokens": extra * 120,
        "unexplained_cost_usd": unexplained_cost,
    }


def run_reconcile(truth: dict[str, object], directory: Path, memory: str) -> dict[str, object]:
    out = directory / "out.json"
    command = [
        sys.executable, "-m", "payonce", "reconcile", "--calls", str(truth["calls"]),
        "--bill", str(truth["pages"]), "--key-map", str(truth["keys"]), "--json", str(out),
        "-q", "--memory-limit", memory, "--temp-dir", str(directory),
    ]  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"reconcile failed with {os.waitstatus_to_exitcode(status)}")
    document = json.loads(out.read_text())
    for name in ("billed_requests", "duplicate_requests", "unexplained_requests"):
        if document[name] != truth[name]:
            raise SystemExit(f"{name}: {document[name]} != truth {truth[name]}")
    if document["unexplained_tokens"] != truth["unexplained_tokens"]:
        raise SystemExit(f"unexplained_tokens {document['unexplained_tokens']} != truth")
    if abs(document["unexplained_cost_usd"] - float(truth["unexplained_cost_usd"])) > 1e-6:
        raise SystemExit("unexplained_cost_usd differs from the truth")
    return {
        "seconds": elapsed,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000_000)
    parser.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    parser.add_argument("--memory-limit", default="4GiB")
    parser.add_argument("--dir", type=Path, default=None, help="where the data goes")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument(
        "--reuse",
        type=Path,
        default=None,
        help="reconcile the data --keep left in this directory (same --calls), not new data",
    )
    args = parser.parse_args()
    if args.reuse:
        truth = truth_of(args.reuse, args.calls, args.format)
        print(f"load average {os.getloadavg()[0]:.2f} before reconcile", flush=True)
        result = run_reconcile(truth, args.reuse, args.memory_limit)
        print(
            f"reconcile: {result['seconds']:.1f} s wall, {result['cpu_seconds']:.1f} s CPU,"
            f" peak RSS {result['peak_rss_mib']:.0f} MiB; figures exact"
            f" (load average {os.getloadavg()[0]:.2f} at the end)"
        )
        return
    base = args.dir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    # The data, plus a fifth of it for DuckDB's spill (reconcile keeps no per-call
    # table, only the calls of repeated business ids), plus 1 GiB of slack.
    needed = int(1.2 * args.calls * BYTES_PER_CALL[args.format]) + (1 << 30)
    free = shutil.disk_usage(base).free
    if free < needed:
        raise SystemExit(
            f"reconcile_usage_scale: {base} has {free / 2**30:.1f} GiB free,"
            f" {needed / 2**30:.1f} GiB needed for {args.calls:,} calls: stopping (use --dir)"
        )
    directory = Path(tempfile.mkdtemp(prefix="payonce-usage-scale-", dir=base))
    try:
        started = time.perf_counter()
        truth = generate(directory, args.calls, args.format)
        generated = time.perf_counter() - started
        size = Path(str(truth["calls"])).stat().st_size
        print(
            f"generated {args.calls:,} calls ({args.format}, {size / 2**30:.2f} GiB,"
            f" {size / args.calls:.0f} B/call) and {HOURS:,} hourly buckets x"
            f" {len(MODELS)} models x {TENANTS} keys in {generated:.1f} s"
        )
        print(f"load average {os.getloadavg()[0]:.2f} before reconcile", flush=True)
        result = run_reconcile(truth, directory, args.memory_limit)
        load = os.getloadavg()[0]
        print(
            f"reconcile: {result['seconds']:.1f} s wall, {result['cpu_seconds']:.1f} s CPU,"
            f" peak RSS {result['peak_rss_mib']:.0f} MiB; figures exact"
            f" (load average {load:.2f} at the end)"
        )
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"max RSS of this script: {own:.0f} MiB")
    finally:
        if args.keep:
            print(f"data kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
