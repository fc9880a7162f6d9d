"""How ``payonce reconcile`` scales, against a plain pandas version of the same join.

Generates a synthetic call log (generic CSV; with ``--jsonl``, also the payonce
JSONL call log) and a bill (the simulator's ledger CSV) with a known duplicate
ratio, then times each implementation in its own process and reports its peak RSS
(``wait4`` rusage of that process alone).

The data: N billed generations, all named by the call log. The first 90% belong to
business requests of their own; each of the last 10% is a duplicate of one of them,
so ``duplicate_ratio`` is exactly 0.1. Costs are exact decimals, so both
implementations must agree to the cent on the wasted cost.

    .venv/bin/python benchmarks/reconcile_scale.py                  # 1M and 10M
    .venv/bin/python benchmarks/reconcile_scale.py --rows 1000000 --pandas-max 1000000

The reconcile run is the real command (``python -m payonce reconcile ... --json``);
its time is measured inside the process (``reconcile()`` from first read to report)
and as wall time of the whole process (interpreter start and imports included).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DUPLICATE_SHARE = 0.1
MODELS = ("gpt-4o-mini", "gpt-4o", "claude-3-5-haiku", "claude-3-5-sonnet")


# ------------------------------------------------------------------ data


def generate(directory: Path, rows: int, jsonl: bool) -> dict[str, Path]:
    """Write calls.csv, bill.csv (and calls.jsonl) for ``rows`` generations, with DuckDB."""
    import duckdb

    unique = int(rows * (1 - DUPLICATE_SHARE))
    connection = duckdb.connect(config={"memory_limit": "4GiB"})
    connection.execute("SET preserve_insertion_order = false")
    connection.execute("SET enable_progress_bar = false")
    # Generation j: business j for the first 90%, else a pseudo-random earlier one.
    # Cost: one of four prices per model, in exact decimals.
    connection.execute(
        f"""
        CREATE VIEW gens AS
        SELECT j,
               'req_' || lpad(j::VARCHAR, 10, '0') AS provider_request_id,
               'order-' || (CASE WHEN j < {unique} THEN j ELSE (j * 7919) % {unique} END)
                   AS business_id,
               list_extract({list(MODELS)}, (j % 4 + 1)::INTEGER) AS model,
               '/v1/chat/completions' AS endpoint,
               'team-' || (j % 7) AS tag,
               TIMESTAMPTZ '2026-11-01 00:00:00+00' + to_seconds((j * 86400 * 7) // {rows})
                   AS ts,
               100 + j % 900 AS input_tokens,
               50 + j % 400 AS output_tokens,
               (0.0001 * (1 + j % 4) * (1 + (j % 13 = 0)::INTEGER))::DECIMAL(18, 10)
                   AS cost_usd
        FROM range({rows}) AS t(j)
        """
    )
    paths = {"calls": directory / "calls.csv", "bill": directory / "bill.csv"}
    connection.execute(
        f"""COPY (SELECT business_id, provider_request_id, model, endpoint, tag,
                         200 AS status, strftime(ts, '%Y-%m-%dT%H:%M:%S.000Z') AS ts
                  FROM gens) TO '{paths["calls"]}' (HEADER)"""
    )
    connection.execute(
        f"""COPY (SELECT provider_request_id, model, endpoint, input_tokens, output_tokens,
                         cost_usd, strftime(ts + INTERVAL 2 SECOND, '%Y-%m-%dT%H:%M:%S.000Z')
                             AS finished_at, true AS client_connected
                  FROM gens) TO '{paths["bill"]}' (HEADER)"""
    )
    if jsonl:
        paths["jsonl"] = directory / "calls.jsonl"
        connection.execute(
            f"""COPY (SELECT 1 AS v, strftime(ts, '%Y-%m-%dT%H:%M:%S.000Z') AS ts,
                             'gw-' || j AS request_id, business_id AS key,
                             'tenant-a' AS tenant, 'POST' AS method, endpoint AS path, model,
                             false AS stream, 'forwarded' AS outcome, 200 AS status,
                             200 AS upstream_status, provider_request_id AS upstream_request_id,
                             1 AS upstream_attempts, 0 AS client_retry,
                             false AS unprotected_retry, input_tokens, output_tokens,
                             NULL AS cached_input_tokens, NULL AS reasoning_tokens,
                             cost_usd::DOUBLE AS cost_usd, NULL AS saved_usd,
                             812.5 AS latency_ms, 800.25 AS upstream_latency_ms
                      FROM gens) TO '{paths["jsonl"]}' (FORMAT JSON)"""
        )
    connection.close()
    return paths


# ------------------------------------------------------------------ implementations


def run_pandas(calls: Path, bill: Path) -> dict[str, float]:
    """The same join in plain pandas: the baseline."""
    import pandas as pd

    started = time.perf_counter()
    calls_frame = pd.read_csv(
        calls, usecols=["business_id", "provider_request_id", "model", "status"]
    )
    bill_frame = pd.read_csv(bill, usecols=["provider_request_id", "model", "cost_usd"])
    generations = bill_frame.groupby("provider_request_id", as_index=False).agg(
        cost_usd=("cost_usd", "sum"), model=("model", "first")
    )
    links = calls_frame.dropna(subset=["provider_request_id"]).drop_duplicates(
        "provider_request_id"
    )[["provider_request_id", "business_id"]]
    joined = generations.merge(links, on="provider_request_id", how="left")
    matched = joined[joined["business_id"].notna()].sort_values(
        ["business_id", "cost_usd", "provider_request_id"]
    )
    duplicate = matched.duplicated("business_id", keep="first")
    calls_frame["success"] = calls_frame["status"].between(200, 299)
    successful = int(calls_frame.groupby("business_id")["success"].any().sum())
    total = float(joined["cost_usd"].sum())
    by_model = (
        matched.assign(duplicate=duplicate, wasted=matched["cost_usd"].where(duplicate, 0.0))
        .groupby("model")
        .agg(generations=("duplicate", "size"), duplicates=("duplicate", "sum"))
    )
    return {
        "seconds": time.perf_counter() - started,
        "billed_generations": len(joined),
        "duplicate_generations": int(duplicate.sum()),
        "duplicate_ratio": float(duplicate.sum()) / len(joined),
        "wasted_cost_usd": round(float(matched["cost_usd"][duplicate].sum()), 6),
        "total_cost_usd": round(total, 6),
        "cost_per_successful_call_usd": round(total / successful, 10),
        "models": len(by_model),
    }


def run_reconcile(calls: Path, bill: Path) -> dict[str, float]:
    """The real command, timed inside the process."""
    from payonce.reconcile.cli import reconcile_command

    with tempfile.TemporaryDirectory() as temp:
        out = Path(temp) / "out.json"
        started = time.perf_counter()
        try:
            reconcile_command.main(
                ["--calls", str(calls), "--bill", str(bill), "--json", str(out), "-q"],
                standalone_mode=False,
            )
        except SystemExit as exit_:
            if exit_.code:
                raise
        seconds = time.perf_counter() - started
        result = json.loads(out.read_text())
    return {
        "seconds": seconds,
        "billed_generations": result["billed_generations"],
        "duplicate_generations": result["duplicate_generations"],
        "duplicate_ratio": result["duplicate_ratio"],
        "wasted_cost_usd": round(result["wasted_cost_usd"], 6),
        "total_cost_usd": round(result["total_cost_usd"], 6),
        "cost_per_successful_call_usd": result["cost_per_successful_call_usd"],
        "models": len(result["by_model"]),
    }


def measure(implementation: str, calls: Path, bill: Path, timeout: float) -> dict[str, float]:
    """Run one implementation in a child process: its result, wall time and peak RSS."""
    command = [sys.executable, __file__, "--child", implementation, str(calls), str(bill)]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    deadline = started + timeout
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            child.kill()
            os.wait4(child.pid, 0)
            return {"timeout": timeout}
        time.sleep(0.05)
    wall = time.perf_counter() - started
    output = child.stdout.read() if child.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{implementation} failed with status {status}:\n{output}")
    result = json.loads(output.strip().splitlines()[-1])
    result["wall_seconds"] = wall
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return result


# ------------------------------------------------------------------ main


def _line(label: str, result: dict[str, float]) -> str:
    if "timeout" in result:
        return f"  {label:<22} timed out after {result['timeout']:.0f} s"
    return (
        f"  {label:<22} {result['seconds']:7.2f} s in process, {result['wall_seconds']:7.2f} s"
        f" wall, peak RSS {result['peak_rss_mib']:7.0f} MiB;"
        f" duplicate_ratio {result['duplicate_ratio']:.6f},"
        f" wasted ${result['wasted_cost_usd']:.4f}, total ${result['total_cost_usd']:.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument(
        "--pandas-max", type=int, default=10_000_000, help="largest size pandas runs at"
    )
    parser.add_argument("--pandas-timeout", type=float, default=600)
    parser.add_argument(
        "--jsonl-max",
        type=int,
        default=1_000_000,
        help="also time the payonce JSONL call log up to this size (0: never)",
    )
    parser.add_argument("--dir", type=Path, help="where to write the data (default: a temp dir)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        implementation, calls, bill = args.child
        run = run_pandas if implementation == "pandas" else run_reconcile
        print(json.dumps(run(Path(calls), Path(bill))))
        return

    print(f"{os.cpu_count()} cores, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(dir=args.dir) as temp:
        for rows in args.rows:
            directory = Path(temp) / str(rows)
            directory.mkdir()
            started = time.perf_counter()
            paths = generate(directory, rows, rows <= args.jsonl_max)
            sizes = ", ".join(
                f"{p.name} {p.stat().st_size / 2**20:,.0f} MiB" for p in paths.values()
            )
            print(
                f"\n{rows:,} calls + {rows:,} bill lines ({sizes}; generated in"
                f" {time.perf_counter() - started:.1f} s), expected duplicate_ratio"
                f" {DUPLICATE_SHARE}"
            )
            ours = measure("reconcile", paths["calls"], paths["bill"], timeout=3600)
            print(_line("payonce reconcile", ours), f"(load average {os.getloadavg()[0]:.1f})")
            if "jsonl" in paths:
                print(
                    _line(
                        "  (payonce JSONL calls)",
                        measure("reconcile", paths["jsonl"], paths["bill"], timeout=3600),
                    )
                )
            if rows <= args.pandas_max:
                theirs = measure("pandas", paths["calls"], paths["bill"], args.pandas_timeout)
                print(_line("pandas", theirs))
                if "timeout" not in theirs:
                    agree = all(
                        abs(ours[key] - theirs[key]) < 1e-6
                        for key in ("duplicate_ratio", "wasted_cost_usd", "total_cost_usd")
                    )
                    print(
                        f"  speedup {theirs['seconds'] / ours['seconds']:.1f}x in process,"
                        f" {theirs['wall_seconds'] / ours['wall_seconds']:.1f}x wall;"
                        f" results agree: {agree}"
                    )
            else:
                print(f"  pandas not run at {rows:,} rows (--pandas-max {args.pandas_max:,})")
            for path in paths.values():
                path.unlink()


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
