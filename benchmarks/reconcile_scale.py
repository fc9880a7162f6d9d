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

The reconcile run is the real command (``payonce reconcile ... --json``); its time
is measured inside the process, from the command's start to its JSON written, with
the libraries imported before the clock starts on both sides (pandas; DuckDB and
rich), and as wall time of the whole process (interpreter start and imports
included).

Two pandas baselines run: the **whole report** (every figure the command computes:
see ``run_pandas_report``) and the **join only** (the duplicate count and waste,
nothing else). The first is the like-for-like comparison; the second shows the
floor of the work.
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


def run_pandas_report(calls: Path, bill: Path) -> dict[str, float]:
    """The whole report in plain pandas: every figure ``payonce reconcile`` computes.

    The same definitions as the command (docs/reconcile.md): generations are the
    bill grouped by request id, each business request keeps its cheapest generation
    (then earliest, then smallest id) and the others are duplicates, a business
    request is successful when one of its calls got a 2xx; figures in total and by
    model, endpoint, tag and UTC day, for generations and business requests; unbilled
    calls; outliers (cost > 5x the median of the model's non-zero generations, models
    with at least 5); the 20 costliest unmatched generations; the period. What it
    leaves out, in pandas's favour: malformed-row accounting (pandas stops at the
    first bad row), bill lines without a request id, and the rare fix-ups for a
    request id on several call lines.
    """
    import pandas as pd

    started = time.perf_counter()
    c = pd.read_csv(
        calls,
        usecols=["business_id", "provider_request_id", "model", "endpoint", "tag", "status", "ts"],
    )
    b = pd.read_csv(
        bill, usecols=["provider_request_id", "model", "endpoint", "cost_usd", "finished_at"]
    )
    c["ts"] = pd.to_datetime(c["ts"], utc=True, format="ISO8601")
    b["ts"] = pd.to_datetime(b["finished_at"], utc=True, format="ISO8601")
    c["success"] = c["status"].between(200, 299)
    links = (
        c.dropna(subset=["provider_request_id"])
        .groupby("provider_request_id", as_index=False)
        .agg(
            business_id=("business_id", "first"),
            call_model=("model", "first"),
            call_endpoint=("endpoint", "first"),
            tag=("tag", "first"),
            call_ts=("ts", "min"),
        )
    )
    g = b.groupby("provider_request_id", as_index=False).agg(
        lines=("cost_usd", "size"),
        cost=("cost_usd", "sum"),
        model=("model", "first"),
        endpoint=("endpoint", "first"),
        ts=("ts", "min"),
    )
    g = g.merge(links, on="provider_request_id", how="left")
    g["matched"] = g["business_id"].notna()
    g["model"] = g["model"].fillna(g["call_model"])
    g["endpoint"] = g["call_endpoint"].fillna(g["endpoint"])
    g["ts"] = g["ts"].fillna(g["call_ts"])
    ranked = g[g["matched"]].sort_values(["business_id", "cost", "ts", "provider_request_id"])
    g["duplicate"] = False
    g.loc[ranked.index[ranked.duplicated("business_id")], "duplicate"] = True
    g["wasted"] = g["cost"].where(g["duplicate"], 0.0)
    g["unmatched_cost"] = g["cost"].where(~g["matched"], 0.0)
    g["unmatched_lines"] = g["lines"].where(~g["matched"], 0)
    g["day"] = g["ts"].dt.floor("D")
    business = c.groupby("business_id", as_index=False).agg(
        success=("success", "any"),
        ts=("ts", "min"),
        model=("model", "first"),
        endpoint=("endpoint", "first"),
        tag=("tag", "first"),
    )
    business["day"] = business["ts"].dt.floor("D")
    unbilled = len(links) - int(g["matched"].sum())

    def generation_figures(frame: pd.DataFrame | pd.core.groupby.DataFrameGroupBy) -> object:
        return frame.agg(
            billed_generations=("cost", "size"),
            matched_generations=("matched", "sum"),
            duplicate_generations=("duplicate", "sum"),
            bill_lines=("lines", "sum"),
            unmatched_bill_lines=("unmatched_lines", "sum"),
            total_cost_usd=("cost", "sum"),
            wasted_cost_usd=("wasted", "sum"),
            unmatched_cost_usd=("unmatched_cost", "sum"),
        )

    figures = {None: generation_figures(g.assign(all=0).groupby("all"))}
    business_figures = {None: business.assign(all=0).groupby("all")["success"].agg(["size", "sum"])}
    for dimension in ("model", "endpoint", "tag", "day"):
        figures[dimension] = generation_figures(g.groupby(dimension))
        business_figures[dimension] = business.groupby(dimension)["success"].agg(["size", "sum"])
    norms = g[g["cost"] > 0].groupby("model")["cost"].agg(["median", "size"])
    norms = norms[(norms["size"] >= 5) & (norms["median"] > 0)]
    scored = g.merge(norms, left_on="model", right_index=True)
    outliers = scored[scored["cost"] > 5 * scored["median"]]
    ratio = outliers["cost"] / outliers["median"]
    top_outliers = outliers.assign(ratio=ratio).nlargest(20, "ratio")
    top_unmatched = g[~g["matched"]].nlargest(20, "cost")
    period = (min(c["ts"].min(), b["ts"].min()), max(c["ts"].max(), b["ts"].max()))
    seconds = time.perf_counter() - started

    totals = figures[None].iloc[0]
    successful = int(business_figures[None]["sum"].iloc[0])
    total = float(totals["total_cost_usd"])
    del top_outliers, top_unmatched, period
    return {
        "seconds": seconds,
        "billed_generations": int(totals["billed_generations"]),
        "duplicate_generations": int(totals["duplicate_generations"]),
        "duplicate_ratio": float(totals["duplicate_generations"]) / len(g),
        "wasted_cost_usd": round(float(totals["wasted_cost_usd"]), 6),
        "total_cost_usd": round(total, 6),
        "cost_per_successful_call_usd": round(total / successful, 10),
        "business_requests": int(business_figures[None]["size"].iloc[0]),
        "unbilled_calls": unbilled,
        "outliers": len(outliers),
        "days": len(figures["day"]),
        "models": len(figures["model"]),
    }


def run_reconcile(calls: Path, bill: Path) -> dict[str, float]:
    """The real command, timed inside the process.

    The command imports DuckDB and rich when it runs; they are imported here
    first, as pandas is imported before its clock starts.
    """
    import payonce.reconcile.main  # noqa: F401  (DuckDB, rich: imported before the clock)
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
        "business_requests": result["business_requests"],
        "unbilled_calls": result["unbilled_calls"],
        "outliers": result["outliers"]["count"],
        "days": len(result["daily"]),
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
        return f"  {label:<24} timed out after {result['timeout']:.0f} s"
    return (
        f"  {label:<24} {result['seconds']:7.2f} s in process, {result['wall_seconds']:7.2f} s"
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
        run = {
            "pandas": run_pandas,
            "pandas-report": run_pandas_report,
            "reconcile": run_reconcile,
        }[implementation]
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
                for name, label in (
                    ("pandas-report", "pandas, whole report"),
                    ("pandas", "pandas, join only"),
                ):
                    theirs = measure(name, paths["calls"], paths["bill"], args.pandas_timeout)
                    print(_line(label, theirs))
                    if "timeout" in theirs:
                        continue
                    agree = all(
                        abs(ours[key] - theirs[key]) < 1e-6
                        for key in ours.keys() & theirs.keys()
                        if key not in ("seconds", "wall_seconds", "peak_rss_mib")
                    )
                    print(
                        f"  speedup over {label}: {theirs['seconds'] / ours['seconds']:.1f}x"
                        f" in process, {theirs['wall_seconds'] / ours['wall_seconds']:.1f}x wall;"
                        f" results agree: {agree}"
                    )
            else:
                print(f"  pandas not run at {rows:,} rows (--pandas-max {args.pandas_max:,})")
            for path in paths.values():
                path.unlink()


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
