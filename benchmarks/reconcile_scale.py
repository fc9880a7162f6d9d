"""How ``payonce reconcile`` scales, against a plain pandas version of the same join.

Generates a synthetic call log (generic CSV; with ``--jsonl``, also the payonce
JSONL call log) and a bill (the simulator's ledger CSV) with a known duplicate
ratio, with DuckDB's ``COPY ... TO`` (parallel; timed on its own), then times each
implementation in its own process and reports its peak RSS (``wait4`` rusage of
that process alone), its CPU time, and for reconcile the time of each phase and
the peak size of DuckDB's spill directory.

The data: N billed generations, all named by the call log. The first 90% belong to
business requests of their own; each of the last 10% is a duplicate of one of them,
so ``duplicate_ratio`` is exactly 0.1. Costs are exact decimals. Every figure the
command prints is checked against the truth computed from the generator's formulas
(counts exactly, money to the cent and beyond), and against pandas where pandas
finishes.

    .venv/bin/python benchmarks/reconcile_scale.py                  # 1M and 10M
    .venv/bin/python benchmarks/reconcile_scale.py --rows 100000000 --dir /big/disk
    .venv/bin/python benchmarks/reconcile_scale.py --rows 1000000 --pandas-max 1000000

Before generating, the benchmark estimates the disk it needs (the data files and
DuckDB's spill, per row as measured on a 1M calibration run, times N) and stops
with one line when ``--dir`` has less free space. The data is deleted afterwards
unless ``--keep``.

The reconcile run is the real command (``payonce reconcile ... --memory-limit 4GiB
--json``); its time is measured inside the process, from the command's start to its
JSON written, with the libraries imported before the clock starts on both sides
(pandas; DuckDB and rich), and as wall time of the whole process (interpreter start
and imports included).

Two pandas baselines run: the **whole report** (every figure the command computes:
see ``run_pandas_report``) and the **join only** (the duplicate count and waste,
nothing else). The first is the like-for-like comparison; the second shows the
floor of the work. Each runs under an address-space limit (``--pandas-memory``,
default 8 GiB: the machine is shared) and reports the step it was in when it ran
out of memory, and its peak RSS then.

``--usage-year`` writes, instead, the data of the aggregated reconciliation target
(a year of hourly OpenAI usage buckets against a payonce call log; see
``generate_usage_year``), without timing anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

DUPLICATE_SHARE = 0.1
MODELS = ("gpt-4o-mini", "gpt-4o", "claude-3-5-haiku", "claude-3-5-sonnet")
CALIBRATION_ROWS = 1_000_000
# The calibration reconciles 1M rows in this much memory, so that nearly all of
# its working set goes to the spill directory: the per-row footprint on disk.
CALIBRATION_MEMORY = "128MiB"
DISK_MARGIN = 1.2
TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%gZ"  # 2026-11-01T00:00:00.000Z, as the call log writes it


def parse_bytes(text: str) -> int:
    """``4GiB``, ``500MB``, ``128MiB`` as bytes (DuckDB's units)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {text!r}")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    powers = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    powers.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
    return int(number * powers[unit])


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


# ------------------------------------------------------------------ data


def _gens_view(rows: int) -> str:
    unique = int(rows * (1 - DUPLICATE_SHARE))
    # Generation j: business j for the first 90%, else a pseudo-random earlier one
    # (j * 7919 mod unique: distinct for distinct j, so each such business request
    # is billed exactly twice). Cost: one of four prices per model, doubled for
    # one generation in 13, in exact decimals.
    return f"""
        CREATE OR REPLACE VIEW gens AS
        SELECT j,
               'req_' || lpad(j::VARCHAR, 10, '0') AS provider_request_id,
               CASE WHEN j < {unique} THEN j ELSE (j * 7919) % {unique} END AS business,
               list_extract({list(MODELS)}, (j % 4 + 1)::INTEGER) AS model,
               '/v1/chat/completions' AS endpoint,
               'team-' || (j % 7) AS tag,
               TIMESTAMP '2026-11-01 00:00:00' + to_seconds((j * 86400 * 7) // {rows}) AS ts,
               100 + j % 900 AS input_tokens,
               50 + j % 400 AS output_tokens,
               (0.0001 * (1 + j % 4) * (1 + (j % 13 = 0)::INTEGER))::DECIMAL(18, 10)
                   AS cost_usd
        FROM range({rows}) AS t(j)
    """


def _duckdb(memory: str = "4GiB") -> Any:
    import duckdb

    connection = duckdb.connect(config={"memory_limit": memory})
    connection.execute("SET preserve_insertion_order = false")
    connection.execute("SET enable_progress_bar = false")
    connection.execute("SET TimeZone = 'UTC'")
    return connection


def generate(directory: Path, rows: int, jsonl: bool) -> dict[str, Path]:
    """Write calls.csv, bill.csv (and calls.jsonl) for ``rows`` generations, with DuckDB."""
    connection = _duckdb()
    connection.execute(_gens_view(rows))
    paths = {"calls": directory / "calls.csv", "bill": directory / "bill.csv"}
    # Timestamps are formatted by the writer (TIMESTAMPFORMAT), a fifth faster
    # than strftime per row.
    connection.execute(
        f"""COPY (SELECT 'order-' || business AS business_id, provider_request_id, model,
                         endpoint, tag, 200 AS status, ts
                  FROM gens) TO '{paths["calls"]}' (HEADER, TIMESTAMPFORMAT '{TS_FORMAT}')"""
    )
    connection.execute(
        f"""COPY (SELECT provider_request_id, model, endpoint, input_tokens, output_tokens,
                         cost_usd, ts + INTERVAL 2 SECOND AS finished_at,
                         true AS client_connected
                  FROM gens) TO '{paths["bill"]}' (HEADER, TIMESTAMPFORMAT '{TS_FORMAT}')"""
    )
    if jsonl:
        paths["jsonl"] = directory / "calls.jsonl"
        connection.execute(
            f"""COPY (SELECT 1 AS v, strftime(ts, '%Y-%m-%dT%H:%M:%S.000Z') AS ts,
                             'gw-' || j AS request_id, 'order-' || business AS key,
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


def truth(rows: int) -> dict[str, Any]:
    """Every checked figure, from the generator's formulas (not from its files).

    Each duplicated business request has two generations; the one it needed is the
    cheaper (then the earlier, then the smaller id: always the original, whose j is
    smaller), so the waste is the duplicate's cost when it is not cheaper, else
    the original's.
    """
    unique = int(rows * (1 - DUPLICATE_SHARE))
    connection = _duckdb()
    connection.execute(_gens_view(rows))
    total, days = connection.execute(
        "SELECT sum(cost_usd), count(DISTINCT (ts + INTERVAL 2 SECOND)::DATE) FROM gens"
    ).fetchone()
    wasted = connection.execute(
        f"""SELECT coalesce(sum(CASE WHEN d.cost_usd < o.cost_usd THEN o.cost_usd
                                     ELSE d.cost_usd END), 0)
            FROM (SELECT * FROM gens WHERE j >= {unique}) d
            JOIN (SELECT j, cost_usd FROM gens WHERE j < {unique}) o ON o.j = d.business"""
    ).fetchone()[0]
    connection.close()
    duplicates = rows - unique
    return {
        "billed_generations": rows,
        "duplicate_generations": duplicates,
        "duplicate_ratio": duplicates / rows,
        "wasted_cost_usd": Decimal(wasted),
        "total_cost_usd": Decimal(total),
        "cost_per_successful_call_usd": round(Decimal(total) / unique, 10),
        "business_requests": unique,
        "unbilled_calls": 0,
        "outliers": 0,
        "days": int(days),
        "models": len(MODELS),
    }


# ------------------------------------------------------------------ the aggregated target


USAGE_KEYS = 8
USAGE_START = 1_767_225_600  # 2026-01-01T00:00:00Z
HOURS = 8760
# One bucket in 97 was billed one request (400 + 100 tokens) the log never sent:
# the unexplained requests the aggregated reconciliation must find.
UNEXPLAINED_EVERY = 97


def generate_usage_year(directory: Path, calls: int) -> dict[str, Any]:
    """A year of hourly OpenAI usage buckets and a payonce call log consistent with it.

    Data for the issue's "aggregated reconciliation of a year of hourly buckets
    (8,760 x models x keys) against 100M calls" target; no timing here (the
    aggregated reconcile is not written yet).

    - ``calls.jsonl``: ``calls`` forwarded calls (call log schema 2), evenly spread
      over 2026 (call j in hour ``j * 8760 // calls``), model ``j % 4``, tenant
      ``tenant-{j // 4 % 8}``. Every tenth call (``j % 10 = 9``) is an unkeyed SDK
      retry of the call before it (same model and tenant, ``key`` null,
      ``client_retry`` 1, ``unprotected_retry``): a duplicate request.
    - ``usage.jsonl``: the Usage API's page objects (``GET
      /v1/organization/usage/completions?bucket_width=1h&group_by=model,api_key_id,
      project_id``), one page per line, 24 hourly buckets (a day) a page, chained by
      ``has_more``/``next_page``. Each bucket has one result per model and key that
      had calls: ``num_model_requests`` and the token sums of the log's calls there,
      plus, in one (hour, model, key) group in 97, one request of 400 + 100 tokens
      the log does not have.
    - ``key-map.json``: tenant id -> ``api_key_id`` (``key_{i}``), project ``proj_{i % 2}``.

    The returned truth: total billed and logged requests, duplicates, unexplained
    requests and tokens.
    """
    directory.mkdir(parents=True, exist_ok=True)
    connection = _duckdb()
    connection.execute(
        f"""CREATE VIEW calls AS
            SELECT j, {USAGE_START} + (j * {HOURS} // {calls}) * 3600
                          + (j * 7 % 3600) AS epoch,
                   (j * {HOURS} // {calls}) AS hour,
                   list_extract({list(MODELS)}, (origin % 4 + 1)::INTEGER) AS model,
                   origin // 4 % {USAGE_KEYS} AS key,
                   j <> origin AS retry,
                   'order-' || origin AS business,
                   100 + j % 900 AS input_tokens, 50 + j % 400 AS output_tokens
            FROM (SELECT j, CASE WHEN j % 10 = 9 THEN j - 1 ELSE j END AS origin
                  FROM range({calls}) AS t(j))"""
    )
    paths = {
        "calls": directory / "calls.jsonl",
        "usage": directory / "usage.jsonl",
        "key_map": directory / "key-map.json",
    }
    connection.execute(
        f"""COPY (SELECT 2 AS v,
                         strftime(make_timestamp(epoch * 1000000), '%Y-%m-%dT%H:%M:%S.000Z')
                             AS ts,
                         'gw-' || j AS request_id,
                         CASE WHEN retry THEN NULL ELSE business END AS key,
                         'tenant-' || key AS tenant, 'POST' AS method,
                         '/v1/chat/completions' AS path, model, false AS stream,
                         'forwarded' AS outcome, 200 AS status, false AS client_disconnected,
                         200 AS upstream_status, 'chatcmpl-' || j AS upstream_request_id,
                         1 AS upstream_attempts, false AS upstream_cancelled,
                         CASE WHEN retry THEN 1 ELSE 0 END AS client_retry,
                         retry AS unprotected_retry, false AS store_bypassed,
                         input_tokens, output_tokens, 0 AS cached_input_tokens,
                         NULL AS reasoning_tokens, NULL::DOUBLE AS cost_usd,
                         NULL AS saved_usd, 812.5 AS latency_ms, 800.25 AS upstream_latency_ms
                  FROM calls) TO '{paths["calls"]}' (FORMAT JSON)"""
    )
    connection.execute(
        """CREATE TABLE results AS
            SELECT hour, model, key, count(*) AS n, sum(input_tokens) AS i,
                   sum(output_tokens) AS o
            FROM calls GROUP BY ALL"""
    )
    connection.execute(
        f"""CREATE TABLE billed AS
            SELECT *, (hash(hour, model, key) % {UNEXPLAINED_EVERY} = 0)::INTEGER AS extra
            FROM results"""
    )
    connection.execute(
        f"""COPY (
            WITH buckets AS (
                SELECT hour, {{'object': 'bucket',
                    'start_time': {USAGE_START} + hour * 3600,
                    'end_time': {USAGE_START} + (hour + 1) * 3600,
                    'results': list({{'object': 'organization.usage.completions.result',
                        'input_tokens': i + 400 * extra, 'output_tokens': o + 100 * extra,
                        'input_cached_tokens': 0, 'num_model_requests': n + extra,
                        'model': model, 'api_key_id': 'key_' || key,
                        'project_id': 'proj_' || (key % 2), 'batch': false,
                        'service_tier': 'default'}} ORDER BY model, key)}} AS bucket
                FROM billed GROUP BY hour
            ), pages AS (
                SELECT hour // 24 AS page, list(bucket ORDER BY hour) AS data
                FROM buckets GROUP BY page
            )
            SELECT 'page' AS object, data, page < max(page) OVER () AS has_more,
                   CASE WHEN page < max(page) OVER ()
                        THEN 'page_' || lpad((page + 1)::VARCHAR, 4, '0') END AS next_page
            FROM pages ORDER BY page
        ) TO '{paths["usage"]}' (FORMAT JSON)"""
    )
    billed, extra, logged = connection.execute(
        "SELECT sum(n + extra), sum(extra), sum(n) FROM billed"
    ).fetchone()
    buckets = connection.execute("SELECT count(DISTINCT hour), count(*) FROM billed").fetchone()
    connection.close()
    key_map = {
        f"tenant-{i}": {"api_key_id": f"key_{i}", "project_id": f"proj_{i % 2}"}
        for i in range(USAGE_KEYS)
    }
    paths["key_map"].write_text(json.dumps(key_map, indent=2) + "\n")
    duplicates = calls // 10  # the j with j % 10 = 9
    return {
        "paths": {k: str(v) for k, v in paths.items()},
        "hours": int(buckets[0]),
        "results": int(buckets[1]),
        "billed_requests": int(billed),
        "logged_upstream_calls": int(logged),
        "business_requests": int(logged) - duplicates,
        "duplicate_requests": duplicates,
        "unexplained_requests": int(extra),
        "unexplained_tokens": int(extra) * 500,
    }


# ------------------------------------------------------------------ implementations


class Stages:
    """The step a baseline is in, printed as it starts (the parent reads the last one
    even when the child is killed) and timed."""

    def __init__(self) -> None:
        self.current = "starting"
        self.started = time.perf_counter()
        self.times: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.times[self.current] = round(now - self.started, 2)
        self.current, self.started = name, now
        print(f"STAGE {name}", flush=True)


def run_pandas(calls: Path, bill: Path, stage: Stages) -> dict[str, float]:
    """The same join in plain pandas: the baseline."""
    import pandas as pd

    started = time.perf_counter()
    stage("reading the calls")
    calls_frame = pd.read_csv(
        calls, usecols=["business_id", "provider_request_id", "model", "status"]
    )
    stage("reading the bill")
    bill_frame = pd.read_csv(bill, usecols=["provider_request_id", "model", "cost_usd"])
    stage("grouping the bill by request id")
    generations = bill_frame.groupby("provider_request_id", as_index=False).agg(
        cost_usd=("cost_usd", "sum"), model=("model", "first")
    )
    stage("deduplicating the calls' request ids")
    links = calls_frame.dropna(subset=["provider_request_id"]).drop_duplicates(
        "provider_request_id"
    )[["provider_request_id", "business_id"]]
    stage("merging the bill with the calls")
    joined = generations.merge(links, on="provider_request_id", how="left")
    stage("sorting each business request's generations")
    matched = joined[joined["business_id"].notna()].sort_values(
        ["business_id", "cost_usd", "provider_request_id"]
    )
    duplicate = matched.duplicated("business_id", keep="first")
    stage("figures")
    calls_frame["success"] = calls_frame["status"].between(200, 299)
    successful = int(calls_frame.groupby("business_id")["success"].any().sum())
    total = float(joined["cost_usd"].sum())
    by_model = (
        matched.assign(duplicate=duplicate, wasted=matched["cost_usd"].where(duplicate, 0.0))
        .groupby("model")
        .agg(generations=("duplicate", "size"), duplicates=("duplicate", "sum"))
    )
    stage("done")
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


def run_pandas_report(calls: Path, bill: Path, stage: Stages) -> dict[str, float]:
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
    stage("reading the calls")
    c = pd.read_csv(
        calls,
        usecols=["business_id", "provider_request_id", "model", "endpoint", "tag", "status", "ts"],
    )
    stage("reading the bill")
    b = pd.read_csv(
        bill, usecols=["provider_request_id", "model", "endpoint", "cost_usd", "finished_at"]
    )
    stage("parsing timestamps")
    c["ts"] = pd.to_datetime(c["ts"], utc=True, format="ISO8601")
    b["ts"] = pd.to_datetime(b["finished_at"], utc=True, format="ISO8601")
    c["success"] = c["status"].between(200, 299)
    stage("grouping the calls by request id")
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
    stage("grouping the bill by request id")
    g = b.groupby("provider_request_id", as_index=False).agg(
        lines=("cost_usd", "size"),
        cost=("cost_usd", "sum"),
        model=("model", "first"),
        endpoint=("endpoint", "first"),
        ts=("ts", "min"),
    )
    stage("merging the bill with the calls")
    g = g.merge(links, on="provider_request_id", how="left")
    g["matched"] = g["business_id"].notna()
    g["model"] = g["model"].fillna(g["call_model"])
    g["endpoint"] = g["call_endpoint"].fillna(g["endpoint"])
    g["ts"] = g["ts"].fillna(g["call_ts"])
    stage("ranking each business request's generations")
    ranked = g[g["matched"]].sort_values(["business_id", "cost", "ts", "provider_request_id"])
    g["duplicate"] = False
    g.loc[ranked.index[ranked.duplicated("business_id")], "duplicate"] = True
    g["wasted"] = g["cost"].where(g["duplicate"], 0.0)
    g["unmatched_cost"] = g["cost"].where(~g["matched"], 0.0)
    g["unmatched_lines"] = g["lines"].where(~g["matched"], 0)
    g["day"] = g["ts"].dt.floor("D")
    stage("grouping the calls by business request")
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

    stage("figures by model, endpoint, tag and day")
    figures = {None: generation_figures(g.assign(all=0).groupby("all"))}
    business_figures = {None: business.assign(all=0).groupby("all")["success"].agg(["size", "sum"])}
    for dimension in ("model", "endpoint", "tag", "day"):
        figures[dimension] = generation_figures(g.groupby(dimension))
        business_figures[dimension] = business.groupby(dimension)["success"].agg(["size", "sum"])
    stage("outliers and lists")
    norms = g[g["cost"] > 0].groupby("model")["cost"].agg(["median", "size"])
    norms = norms[(norms["size"] >= 5) & (norms["median"] > 0)]
    scored = g.merge(norms, left_on="model", right_index=True)
    outliers = scored[scored["cost"] > 5 * scored["median"]]
    ratio = outliers["cost"] / outliers["median"]
    top_outliers = outliers.assign(ratio=ratio).nlargest(20, "ratio")
    top_unmatched = g[~g["matched"]].nlargest(20, "cost")
    period = (min(c["ts"].min(), b["ts"].min()), max(c["ts"].max(), b["ts"].max()))
    seconds = time.perf_counter() - started
    stage("done")

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


def _phase_timer() -> dict[str, float]:
    """Time every statement of the reconcile engine, by the phase it belongs to.

    The engine labels its long statements (``progress=``, ``source=``); the others
    go to the phase before them, or to "figures and lists" after the duplicates.
    Each new phase is printed as a ``STAGE`` line, for the parent. Only this
    benchmark's child process is patched.
    """
    from payonce.reconcile import engine

    phases: dict[str, float] = {}
    state = {"phase": "setup"}

    def wrap(name: str) -> None:
        original = getattr(engine.Engine, name)

        def timed(self: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
            label = kwargs.get("progress") or kwargs.get("source")
            if label:
                source = kwargs.get("source")
                state["phase"] = f"loading {Path(source).name}" if source else label
            elif state["phase"] == "finding duplicates":
                state["phase"] = "figures and lists"
            if state["phase"] != state.get("printed"):
                state["printed"] = state["phase"]
                print(f"STAGE {state['phase']}", flush=True)
            started = time.perf_counter()
            try:
                return original(self, sql, *args, **kwargs)
            finally:
                phase = state["phase"]
                phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - started

        setattr(engine.Engine, name, timed)

    for name in ("execute", "rows", "dicts"):
        wrap(name)
    return phases


def run_reconcile(calls: Path, bill: Path, memory_limit: str, temp_dir: str) -> dict[str, Any]:
    """The real command, timed inside the process.

    The command imports DuckDB and rich when it runs; they are imported here
    first, as pandas is imported before its clock starts.
    """
    import payonce.reconcile.main  # noqa: F401  (DuckDB, rich: imported before the clock)
    from payonce.reconcile.cli import reconcile_command

    phases = _phase_timer()
    with tempfile.TemporaryDirectory() as temp:
        out = Path(temp) / "out.json"
        argv = ["--calls", str(calls), "--bill", str(bill), "--json", str(out), "-q"]
        argv += ["--memory-limit", memory_limit]
        if temp_dir:
            argv += ["--temp-dir", temp_dir]
        started = time.perf_counter()
        try:
            reconcile_command.main(argv, standalone_mode=False)
        except SystemExit as exit_:
            if exit_.code:
                raise
        seconds = time.perf_counter() - started
        result = json.loads(out.read_text())
    return {
        "seconds": seconds,
        "phases": {name: round(value, 2) for name, value in phases.items()},
        "billed_generations": result["billed_generations"],
        "duplicate_generations": result["duplicate_generations"],
        "duplicate_ratio": result["duplicate_ratio"],
        # The JSON carries money as numbers: str() keeps every digit written.
        "wasted_cost_usd": str(result["wasted_cost_usd"]),
        "total_cost_usd": str(result["total_cost_usd"]),
        "cost_per_successful_call_usd": result["cost_per_successful_call_usd"],
        "models": len(result["by_model"]),
        "business_requests": result["business_requests"],
        "unbilled_calls": result["unbilled_calls"],
        "outliers": result["outliers"]["count"],
        "days": len(result["daily"]),
    }


def _disk_usage(directory: Path) -> int:
    """Bytes the files under ``directory`` take on disk (allocated blocks)."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue  # DuckDB removed it meanwhile
    return total


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(
    implementation: str,
    calls: Path,
    bill: Path,
    timeout: float,
    *,
    memory_limit: str = "4GiB",
    spill_dir: Path | None = None,
    address_limit: int = 0,
    on_stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run one implementation in a child process: its result, wall and CPU time, peak
    RSS, peak spill (``spill_dir``; also by stage), the load average while it ran.
    ``on_stage`` is called with each stage the child reports, as it starts.

    With ``address_limit``, the child runs under that ``RLIMIT_AS`` and is also
    killed if its RSS passes it; a child that runs out of memory reports the stage
    it was in.
    """
    command = [sys.executable, __file__, "--child", implementation, str(calls), str(bill)]
    command += ["--memory-limit", memory_limit, "--child-temp", str(spill_dir or "")]
    command += ["--child-as", str(address_limit)]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Read the pipes as they fill, or a chatty child would block on a full pipe.
    captured: dict[str, list[str]] = {"out": [], "err": []}
    current = {"stage": "starting"}

    def read(stream: Any, key: str) -> None:
        for line in stream:
            captured[key].append(line)
            if line.startswith("STAGE "):
                current["stage"] = line[6:].strip()

    readers = [
        threading.Thread(target=read, args=(stream, key), daemon=True)
        for stream, key in ((child.stdout, "out"), (child.stderr, "err"))
    ]
    for reader in readers:
        reader.start()
    deadline = started + timeout
    peak_spill, loads, killed = 0, [os.getloadavg()[0]], ""
    spill_by_stage: dict[str, int] = {}
    seen_stage = "starting"
    next_sample = started + 0.5
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        now = time.perf_counter()
        if now > deadline:
            killed = f"timed out after {timeout:.0f} s"
        elif address_limit and _rss(child.pid) > address_limit:
            killed = f"killed at {gib(address_limit)} RSS"
        if killed:
            child.kill()
            _, status, usage = os.wait4(child.pid, 0)
            break
        stage = current["stage"]
        if stage != seen_stage:
            seen_stage = stage
            if on_stage is not None:
                on_stage(stage)
        if now >= next_sample:
            if spill_dir is not None:
                used = _disk_usage(spill_dir)
                peak_spill = max(peak_spill, used)
                spill_by_stage[stage] = max(spill_by_stage.get(stage, 0), used)
            if len(loads) < 2 or now - started > 15 * (len(loads) - 1):
                loads.append(os.getloadavg()[0])
            next_sample = now + 0.5
        time.sleep(0.05)
    wall = time.perf_counter() - started
    for reader in readers:
        reader.join(timeout=5)
    loads.append(os.getloadavg()[0])
    lines = "".join(captured["out"]).strip().splitlines()
    stages = [line[6:] for line in lines if line.startswith("STAGE ")]
    measured = {
        "wall_seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux reports KiB
        "load_average": [round(x, 1) for x in loads],
    }
    if spill_dir is not None:
        measured["peak_spill_bytes"] = peak_spill
        measured["peak_spill_by_stage"] = spill_by_stage
    result_lines = [line for line in lines if line.startswith("{")]
    if not killed and os.waitstatus_to_exitcode(status) == 0 and result_lines:
        result = json.loads(result_lines[-1])
        if "out_of_memory" not in result:
            return {**result, **measured}
        return {**result, **measured, "failed": f"out of memory ({result['out_of_memory']})"}
    if not killed:
        code = os.waitstatus_to_exitcode(status)
        killed = f"died by signal {-code}" if code < 0 else f"exited with status {code}"
        if not stages:
            err = "".join(captured["err"]).strip().splitlines()[-5:]
            raise RuntimeError(f"{implementation} {killed}:\n" + "\n".join(err))
    return {**measured, "failed": killed, "stage": stages[-1] if stages else "starting"}


def _child(args: argparse.Namespace) -> None:
    implementation, calls, bill = args.child
    limit = int(args.child_as)
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if implementation == "reconcile":
        result = run_reconcile(Path(calls), Path(bill), args.memory_limit, args.child_temp)
        print(json.dumps(result))
        return
    stage = Stages()
    run = {"pandas": run_pandas, "pandas-report": run_pandas_report}[implementation]
    try:
        print(json.dumps(run(Path(calls), Path(bill), stage)), flush=True)
    except MemoryError as exc:
        # What pandas allocated stays allocated while the traceback lives: report
        # the peak as it was and leave.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            json.dumps(
                {
                    "out_of_memory": f"{type(exc).__name__} {str(exc)[:120]}".strip(),
                    "stage": stage.current,
                    "stage_peak_rss_mib": peak,
                    "stage_seconds": round(time.perf_counter() - stage.started, 1),
                    "stages": stage.times,
                }
            ),
            flush=True,
        )


# ------------------------------------------------------------------ disk


def calibrate(directory: Path, jsonl: bool) -> dict[str, float]:
    """Bytes per row on disk: each data file, and DuckDB's spill at 1M rows.

    The 1M reconcile runs in ``CALIBRATION_MEMORY``: nearly all its working set is
    spilled, so peak spill + that memory, per row, is the footprint that a larger
    run spills beyond its ``--memory-limit``; measured while the files are loaded
    (``load_footprint``) and overall (``footprint``).
    """
    work = directory / "calibration"
    work.mkdir()
    try:
        paths = generate(work, CALIBRATION_ROWS, jsonl)
        sizes = {name: path.stat().st_size / CALIBRATION_ROWS for name, path in paths.items()}
        spill = work / "spill"
        spill.mkdir()
        result = measure(
            "reconcile",
            paths["calls"],
            paths["bill"],
            timeout=600,
            memory_limit=CALIBRATION_MEMORY,
            spill_dir=spill,
        )
        memory = parse_bytes(CALIBRATION_MEMORY)
        loading = [v for k, v in result["peak_spill_by_stage"].items() if k.startswith("loading")]
        sizes["footprint"] = (result["peak_spill_bytes"] + memory) / CALIBRATION_ROWS
        sizes["load_footprint"] = (max(loading, default=0) + memory) / CALIBRATION_ROWS
        return sizes
    finally:
        shutil.rmtree(work, ignore_errors=True)


def disk_needed(
    rows: int, sizes: dict[str, float], memory_limit: str, jsonl: bool, keep: bool
) -> dict[str, int]:
    """The disk a size needs: its data files, and DuckDB's spill beyond the memory limit.

    Unless ``--keep``, the data files are deleted as soon as reconcile has loaded
    them (it runs last), so they only add to the spill of the loading phase.
    """
    data = rows * (sizes["calls"] + sizes["bill"] + (sizes.get("jsonl", 0) if jsonl else 0))
    memory = parse_bytes(memory_limit)
    spill = max(0.0, rows * sizes["footprint"] - memory)
    load_spill = max(0.0, rows * sizes["load_footprint"] - memory)
    peak = data + spill if keep else max(data + load_spill, spill)
    return {"data": int(data), "spill": int(spill), "total": int(peak * DISK_MARGIN)}


# ------------------------------------------------------------------ main

_NOT_FIGURES = {
    "seconds",
    "wall_seconds",
    "cpu_seconds",
    "peak_rss_mib",
    "peak_spill_bytes",
    "peak_spill_by_stage",
    "phases",
    "load_average",
}


def _line(label: str, result: dict[str, Any]) -> str:
    loads = result.get("load_average", [])
    load = f" (load average {min(loads):.1f}-{max(loads):.1f})" if loads else ""
    if "failed" in result:
        peak = result.get("stage_peak_rss_mib", result["peak_rss_mib"])
        return (
            f"  {label:<24} {result['failed']} while {result.get('stage', '?')},"
            f" after {result['wall_seconds']:.1f} s wall, peak RSS {peak:,.0f} MiB{load}"
        )
    spill = result.get("peak_spill_bytes")
    spilled = f", peak spill {gib(spill)}" if spill else ""
    return (
        f"  {label:<24} {result['seconds']:7.2f} s in process, {result['wall_seconds']:7.2f} s"
        f" wall, {result['cpu_seconds']:7.1f} s CPU, peak RSS {result['peak_rss_mib']:7,.0f} MiB"
        f"{spilled}; duplicate_ratio {result['duplicate_ratio']:.6f},"
        f" wasted ${Decimal(str(result['wasted_cost_usd'])):.4f},"
        f" total ${Decimal(str(result['total_cost_usd'])):.4f}{load}"
    )


def check(result: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """The figures that differ from the truth (money to the 1e-10 the JSON carries)."""
    wrong = []
    for key, want in expected.items():
        got = result.get(key)
        if isinstance(want, Decimal):
            # The JSON carries dollars to 1e-10 as a number: exact to that.
            ok = got is not None and float(got) == float(want.quantize(Decimal("1e-10")))
        elif isinstance(want, float):
            ok = got is not None and abs(float(got) - want) < 1e-12
        else:
            ok = got == want
        if not ok:
            wrong.append(f"{key}: {got} (expected {want})")
    return wrong


def _agree(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    # pandas sums money in floats: agreement is to a millionth of a dollar.
    return all(
        abs(float(ours[key]) - float(theirs[key])) < 1e-6
        for key in ours.keys() & theirs.keys()
        if key not in _NOT_FIGURES
    )


@contextmanager
def workspace(parent: Path | None, keep: bool) -> Iterator[Path]:
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="reconcile-scale-", dir=parent))
    try:
        yield path
    finally:
        if keep:
            print(f"\ndata kept in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def run_size(
    args: argparse.Namespace,
    work: Path,
    rows: int,
    sizes: dict[str, float] | None,
    report: Callable[[dict[str, Any]], None],
) -> bool:
    """Generate, run and compare one size; False when the disk is too small.

    pandas runs first and reconcile on the CSV files last, so that the data files
    can be deleted once reconcile has loaded them (unless ``--keep``).
    """
    jsonl = rows <= args.jsonl_max
    if sizes is not None:
        needed = disk_needed(rows, sizes, args.memory_limit, jsonl, args.keep)
        if args.reuse:  # the data is on the disk already: only the spill is to come
            needed["total"] = int(needed["spill"] * DISK_MARGIN)
        free = shutil.disk_usage(work).free
        print(
            f"\n{rows:,} rows need about {gib(needed['total'])} of disk (data"
            f" {gib(needed['data'])}, DuckDB spill {gib(needed['spill'])}, x{DISK_MARGIN});"
            f" {gib(free)} free in {work}",
            flush=True,
        )
        if free < needed["total"]:
            print(
                f"reconcile_scale: not enough disk for {rows:,} rows in {work}"
                f" ({gib(needed['total'])} needed, {gib(free)} free): stopping"
                " (choose another --dir, or fewer --rows)"
            )
            return False
    if args.reuse:
        # Data an earlier --keep left: the truth follows from the generator's formulas.
        directory = args.reuse
        paths = {"calls": directory / "calls.csv", "bill": directory / "bill.csv"}
        if jsonl and (directory / "calls.jsonl").exists():
            paths["jsonl"] = directory / "calls.jsonl"
        jsonl = "jsonl" in paths
        generated = 0.0
    else:
        directory = work / str(rows)
        directory.mkdir()
        started = time.perf_counter()
        paths = generate(directory, rows, jsonl)
        generated = time.perf_counter() - started
    file_sizes = {p.name: p.stat().st_size for p in paths.values()}
    started = time.perf_counter()
    expected = truth(rows)
    truth_seconds = time.perf_counter() - started
    described = ", ".join(
        f"{name} {size / 2**20:,.0f} MiB ({size / rows:.0f} B/row)"
        for name, size in file_sizes.items()
    )
    print(
        f"\n{rows:,} calls + {rows:,} bill lines ({described}; generated by DuckDB in"
        f" {generated:.1f} s, the truth computed in {truth_seconds:.1f} s): expected"
        f" duplicate_ratio {DUPLICATE_SHARE}, wasted ${expected['wasted_cost_usd']},"
        f" total ${expected['total_cost_usd']}",
        flush=True,
    )
    record: dict[str, Any] = {
        "rows": rows,
        "generation_seconds": round(generated, 1),
        "file_bytes": file_sizes,
        "expected": {k: str(v) for k, v in expected.items()},
    }
    baselines: list[tuple[str, dict[str, Any]]] = []
    if rows <= args.pandas_max:
        cap = parse_bytes(args.pandas_memory)
        for name, label in (
            ("pandas-report", "pandas, whole report"),
            ("pandas", "pandas, join only"),
        ):
            theirs = measure(
                name, paths["calls"], paths["bill"], args.pandas_timeout, address_limit=cap
            )
            print(_line(label, theirs), flush=True)
            record[name] = theirs
            baselines.append((label, theirs))
    else:
        print(f"  pandas not run at {rows:,} rows (--pandas-max {args.pandas_max:,})")
    if jsonl:
        theirs = measure(
            "reconcile",
            paths["jsonl"],
            paths["bill"],
            timeout=args.reconcile_timeout,
            memory_limit=args.memory_limit,
        )
        print(_line("payonce JSONL calls", theirs), flush=True)
        record["reconcile_jsonl"] = theirs

    def loaded(stage: str) -> None:
        if (
            not (args.keep or args.reuse)
            and stage not in ("starting", "setup")
            and not stage.startswith("load")
        ):
            for path in paths.values():
                path.unlink(missing_ok=True)

    spill = directory / "spill"
    spill.mkdir(exist_ok=True)
    ours = measure(
        "reconcile",
        paths["calls"],
        paths["bill"],
        timeout=args.reconcile_timeout,
        memory_limit=args.memory_limit,
        spill_dir=spill,
        on_stage=loaded,
    )
    print(_line(f"payonce reconcile {args.memory_limit}", ours))
    record["reconcile"] = ours
    if "failed" not in ours:
        phases = ", ".join(f"{name} {value:.1f} s" for name, value in ours["phases"].items())
        print(f"    phases: {phases}")
        wrong = check(ours, expected)
        record["exact"] = not wrong
        print(
            "    figures exact against the generated truth"
            if not wrong
            else "    FIGURES WRONG: " + "; ".join(wrong)
        )
        for label, theirs in baselines:
            if "failed" in theirs:
                continue
            print(
                f"  speedup over {label}: {theirs['seconds'] / ours['seconds']:.1f}x"
                f" in process, {theirs['wall_seconds'] / ours['wall_seconds']:.1f}x wall;"
                f" results agree: {_agree(ours, theirs)}"
            )
    report(record)
    if args.keep or args.reuse:
        shutil.rmtree(spill, ignore_errors=True)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--memory-limit", default="4GiB", help="reconcile's --memory-limit")
    parser.add_argument(
        "--pandas-max", type=int, default=100_000_000, help="largest size pandas runs at"
    )
    parser.add_argument(
        "--pandas-memory",
        default="8GiB",
        help="address-space limit of each pandas process (RLIMIT_AS; also killed beyond it)",
    )
    parser.add_argument("--pandas-timeout", type=float, default=900)
    parser.add_argument("--reconcile-timeout", type=float, default=3600)
    parser.add_argument(
        "--jsonl-max",
        type=int,
        default=1_000_000,
        help="also time the payonce JSONL call log up to this size (0: never)",
    )
    parser.add_argument("--dir", type=Path, help="where to write the data (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--reuse",
        type=Path,
        metavar="DIR",
        help="reconcile the calls.csv and bill.csv that --keep left in DIR (one --rows,"
        " the same) instead of generating them",
    )
    parser.add_argument("--json", type=Path, help="also write every result to this file")
    parser.add_argument(
        "--usage-year",
        type=int,
        metavar="CALLS",
        help="only write the aggregated target's data (a year of hourly usage pages and"
        " a call log of CALLS calls) into --dir, and print its truth",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--child-temp", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-as", default="0", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        _child(args)
        return
    if args.usage_year:
        # ~600 bytes per call log line (the usage pages are ~70 MiB in all).
        needed = int((args.usage_year * 600 + 70 * 2**20) * DISK_MARGIN)
        target = args.dir or Path(tempfile.gettempdir())
        target.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(target).free
        if free < needed:
            print(
                f"reconcile_scale: the usage year needs about {gib(needed)} in {target},"
                f" only {gib(free)} free: stopping"
            )
            sys.exit(1)
        started = time.perf_counter()
        result = generate_usage_year(target / f"usage-year-{args.usage_year}", args.usage_year)
        print(json.dumps(result, indent=2))
        print(f"generated by DuckDB in {time.perf_counter() - started:.1f} s")
        return

    print(
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]},"
        f" load average {os.getloadavg()[0]:.1f}, reconcile --memory-limit {args.memory_limit}"
    )
    results: list[dict[str, Any]] = []

    def report(record: dict[str, Any]) -> None:
        results.append(record)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")

    with workspace(args.dir, args.keep) as work:
        sizes = None
        if max(args.rows) > CALIBRATION_ROWS:
            started = time.perf_counter()
            sizes = calibrate(work, max(args.rows) <= args.jsonl_max)
            print(
                f"disk per row (1M calibration, {time.perf_counter() - started:.0f} s):"
                f" calls.csv {sizes['calls']:.0f} B, bill.csv {sizes['bill']:.0f} B,"
                f" DuckDB's working set {sizes['footprint']:.0f} B"
                f" ({sizes['load_footprint']:.0f} B while loading), spilled beyond"
                " --memory-limit",
                flush=True,
            )
        for rows in sorted(args.rows):
            if not run_size(args, work, rows, sizes, report):
                sys.exit(1)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
