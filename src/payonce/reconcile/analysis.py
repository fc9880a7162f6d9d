"""The join and the figures, as DuckDB statements over ``calls`` and ``bill``.

::

    calls ──(provider request id)──► links ─┐
    bill ──(group by request id)──► generations ◄─┘ left join
                                        │ rank per business request: cheapest first
                                        ▼
            duplicates, waste, unmatched, outliers, breakdowns by model/endpoint/tag/day
    calls ──(group by business id)──► business requests (success, model, day)

The big intermediate tables are dropped as soon as the next one is built, so at
most two of them live at a time (DuckDB spills them to ``--temp-dir`` when they
outgrow ``--memory-limit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from payonce.reconcile.engine import Engine
from payonce.reconcile.report import (
    BillItem,
    Figures,
    MalformedRow,
    Outlier,
    Outliers,
    Slice,
)

__all__ = ["Analysis", "AnalysisSettings", "analyse"]

_DIMENSIONS = ("model", "endpoint", "tag", "day")

_LINKS = """
CREATE TABLE links AS
SELECT provider_request_id AS pid,
       min(business_id) AS business_id,
       min(business_id) IS DISTINCT FROM max(business_id) AS conflicting,
       min(business_id) IS NULL AND bool_or(unkeyed_retry) AS unkeyed_retry,
       min(model) AS model, min(endpoint) AS endpoint, min(tag) AS tag, min(ts) AS ts
FROM calls WHERE provider_request_id IS NOT NULL GROUP BY provider_request_id;

CREATE TABLE business AS
SELECT business_id, bool_or(success) AS success, min(ts) AS first_ts,
       min(model) AS model, min(endpoint) AS endpoint, min(tag) AS tag
FROM calls WHERE business_id IS NOT NULL GROUP BY business_id;
"""

_GENERATIONS = """
CREATE TABLE generations AS
WITH grouped AS (
    SELECT coalesce(provider_request_id, '#' || src || ':' || pos) AS gid,
           any_value(provider_request_id) AS pid, count(*) AS lines,
           sum(cost_usd) AS cost, min(model) AS model, min(endpoint) AS endpoint,
           min(ts) AS ts, min(src) AS src
    FROM bill GROUP BY 1
), joined AS (
    SELECT g.gid, g.pid, g.lines, g.cost, g.src,
           coalesce(g.model, l.model) AS model,
           coalesce(l.endpoint, g.endpoint) AS endpoint,
           l.tag, coalesce(g.ts, l.ts) AS ts,
           l.pid IS NOT NULL AS matched, l.business_id,
           coalesce(l.unkeyed_retry, false) AS unkeyed_retry
    FROM grouped g LEFT JOIN links l ON g.pid = l.pid
)
SELECT *,
       -- The cheapest generation of a business request is the one it needed;
       -- every other one is a duplicate (so the waste is a lower bound).
       matched AND (unkeyed_retry OR (business_id IS NOT NULL AND row_number() OVER (
           PARTITION BY coalesce(business_id, gid) ORDER BY cost, ts NULLS LAST, gid) > 1
       )) AS duplicate
FROM joined;
"""

_BUSINESS_REQUESTS = """
CREATE TABLE business_requests AS
SELECT b.business_id, b.success,
       coalesce(k.model, b.model) AS model,
       coalesce(b.endpoint, k.endpoint) AS endpoint,
       b.tag, CAST(coalesce(b.first_ts, k.ts) AS DATE) AS day
FROM business b LEFT JOIN (
    SELECT business_id, model, endpoint, ts FROM generations
    WHERE business_id IS NOT NULL AND matched AND NOT duplicate
) k USING (business_id);
DROP TABLE business;
"""

_GENERATION_FIGURES = """
SELECT GROUPING(model, endpoint, tag, day) AS grouping_id, model, endpoint, tag, day,
       count(*) AS billed_generations,
       count(*) FILTER (matched) AS matched_generations,
       count(*) FILTER (duplicate) AS duplicate_generations,
       count(*) FILTER (unkeyed_retry) AS unkeyed_retry_generations,
       sum(lines) AS bill_lines,
       coalesce(sum(lines) FILTER (NOT matched), 0) AS unmatched_bill_lines,
       coalesce(sum(cost), 0) AS total_cost_usd,
       coalesce(sum(cost) FILTER (duplicate), 0) AS wasted_cost_usd,
       coalesce(sum(cost) FILTER (NOT matched), 0) AS unmatched_cost_usd
FROM (SELECT *, CAST(ts AS DATE)::VARCHAR AS day FROM generations)
GROUP BY GROUPING SETS ((), (model), (endpoint), (tag), (day))
"""

_BUSINESS_FIGURES = """
SELECT GROUPING(model, endpoint, tag, day) AS grouping_id, model, endpoint, tag, day,
       count(*) AS business_requests,
       count(*) FILTER (success) AS successful_business_requests
FROM (SELECT * REPLACE (day::VARCHAR AS day) FROM business_requests)
GROUP BY GROUPING SETS ((), (model), (endpoint), (tag), (day))
"""

_OUTLIERS = """
CREATE TEMP TABLE outliers AS
WITH norms AS (
    SELECT model, median(cost) AS median, count(*) AS n
    FROM generations WHERE model IS NOT NULL AND cost > 0 GROUP BY model
)
SELECT g.*, norms.median FROM generations g JOIN norms USING (model)
WHERE norms.n >= {min_generations} AND norms.median > 0 AND g.cost > {factor} * norms.median
"""


@dataclass(frozen=True, slots=True)
class AnalysisSettings:
    """Knobs of the analysis: the outlier rule and how much detail to list."""

    outlier_factor: float = 5.0
    outlier_min_generations: int = 5
    top: int = 20
    max_breakdown: int = 100
    malformed_listed: int = 20


@dataclass(frozen=True, slots=True)
class Analysis:
    """What :func:`analyse` returns; ``run`` adds the inputs and builds the report."""

    totals: Figures
    breakdowns: Mapping[str, tuple[Slice, ...]]
    truncated: Mapping[str, int]
    outliers: Outliers
    unmatched: tuple[BillItem, ...]
    malformed: tuple[MalformedRow, ...]
    malformed_rows: int
    unbilled_calls: int
    conflicting_request_ids: int
    period: tuple[Any, Any]


def analyse(engine: Engine, files: Mapping[int, str], settings: AnalysisSettings) -> Analysis:
    """Join the loaded ``calls`` and ``bill`` tables and compute every figure."""
    engine.execute(_LINKS, progress="grouping calls")
    conflicting = int(engine.scalar("SELECT count(*) FROM links WHERE conflicting") or 0)
    calls_period = engine.rows("SELECT min(ts), max(ts) FROM calls")[0]
    engine.execute("DROP TABLE calls")
    engine.execute(_GENERATIONS, progress="joining calls with the bill")
    unbilled = int(
        engine.scalar("SELECT count(*) FROM links l ANTI JOIN generations g ON l.pid = g.pid") or 0
    )
    engine.execute("DROP TABLE bill; DROP TABLE links")
    engine.execute(_BUSINESS_REQUESTS, progress="business requests")
    slices = _figures(engine)
    totals = slices.pop(("", None), Figures())
    breakdowns: dict[str, tuple[Slice, ...]] = {}
    truncated: dict[str, int] = {}
    for dimension in _DIMENSIONS:
        found = [Slice(key, figures) for (dim, key), figures in slices.items() if dim == dimension]
        if dimension == "day":
            found.sort(key=lambda s: (s.key is None, s.key or ""))
            # Without timestamps there is no trend, only a single "unknown" day.
            breakdowns[dimension] = tuple(s for s in found if s.key is not None)
            continue
        found.sort(key=lambda s: (-s.figures.total_cost_usd, s.label))
        if len(found) > settings.max_breakdown:
            truncated[dimension] = len(found) - settings.max_breakdown
        breakdowns[dimension] = tuple(found[: settings.max_breakdown])
    bill_period = engine.rows("SELECT min(ts), max(ts) FROM generations")[0]
    starts = [t for t in (bill_period[0], calls_period[0]) if t is not None]
    ends = [t for t in (bill_period[1], calls_period[1]) if t is not None]
    malformed_rows = int(engine.scalar("SELECT count(*) FROM malformed") or 0)
    return Analysis(
        totals=totals,
        breakdowns=breakdowns,
        truncated=truncated,
        outliers=_outliers(engine, files, settings),
        unmatched=_unmatched(engine, files, settings.top),
        malformed=_malformed(engine, files, settings.malformed_listed),
        malformed_rows=malformed_rows,
        unbilled_calls=unbilled,
        conflicting_request_ids=conflicting,
        period=(min(starts, default=None), max(ends, default=None)),
    )


def _slice_key(row: Mapping[str, Any]) -> tuple[str, str | None]:
    # GROUPING() sets a bit for each column *not* grouped: 0b0111 means "by day".
    grouped = [
        dim for bit, dim in enumerate(reversed(_DIMENSIONS)) if not row["grouping_id"] >> bit & 1
    ]
    if not grouped:
        return ("", None)
    dimension = grouped[0]
    value = row[dimension]
    return (dimension, None if value is None else str(value))


def _figures(engine: Engine) -> dict[tuple[str, str | None], Figures]:
    generation_rows = {_slice_key(row): row for row in engine.dicts(_GENERATION_FIGURES)}
    business_rows = {_slice_key(row): row for row in engine.dicts(_BUSINESS_FIGURES)}
    slices: dict[tuple[str, str | None], Figures] = {}
    for key in generation_rows.keys() | business_rows.keys():
        generations = generation_rows.get(key, {})
        business = business_rows.get(key, {})
        slices[key] = Figures(
            billed_generations=int(generations.get("billed_generations", 0)),
            matched_generations=int(generations.get("matched_generations", 0)),
            duplicate_generations=int(generations.get("duplicate_generations", 0)),
            unkeyed_retry_generations=int(generations.get("unkeyed_retry_generations", 0)),
            bill_lines=int(generations.get("bill_lines") or 0),
            unmatched_bill_lines=int(generations.get("unmatched_bill_lines", 0)),
            total_cost_usd=Decimal(generations.get("total_cost_usd", 0)),
            wasted_cost_usd=Decimal(generations.get("wasted_cost_usd", 0)),
            unmatched_cost_usd=Decimal(generations.get("unmatched_cost_usd", 0)),
            business_requests=int(business.get("business_requests", 0)),
            successful_business_requests=int(business.get("successful_business_requests", 0)),
        )
    return slices


def _outliers(engine: Engine, files: Mapping[int, str], settings: AnalysisSettings) -> Outliers:
    engine.execute(
        _OUTLIERS.format(
            min_generations=int(settings.outlier_min_generations),
            factor=float(settings.outlier_factor),
        )
    )
    count, cost, excess = engine.rows(
        "SELECT count(*), coalesce(sum(cost), 0), coalesce(sum(cost - median), 0) FROM outliers"
    )[0]
    top = tuple(
        Outlier(
            provider_request_id=row["pid"],
            business_id=row["business_id"],
            model=row["model"],
            cost_usd=Decimal(row["cost"]),
            model_median_usd=Decimal(row["median"]),
            ts=row["ts"],
            file=files.get(row["src"], "?"),
        )
        for row in engine.dicts(
            "SELECT pid, business_id, model, cost, median, ts, src FROM outliers"
            f" ORDER BY cost / median DESC, cost DESC, gid LIMIT {int(settings.top)}"
        )
    )
    return Outliers(
        factor=settings.outlier_factor,
        min_generations=settings.outlier_min_generations,
        count=int(count),
        cost_usd=Decimal(cost),
        excess_cost_usd=Decimal(excess),
        top=top,
    )


def _unmatched(engine: Engine, files: Mapping[int, str], top: int) -> tuple[BillItem, ...]:
    return tuple(
        BillItem(
            provider_request_id=row["pid"],
            cost_usd=Decimal(row["cost"] or 0),
            lines=int(row["lines"]),
            model=row["model"],
            ts=row["ts"],
            file=files.get(row["src"], "?"),
        )
        for row in engine.dicts(
            "SELECT pid, cost, lines, model, ts, src FROM generations WHERE NOT matched"
            f" ORDER BY cost DESC NULLS LAST, gid LIMIT {int(top)}"
        )
    )


def _malformed(engine: Engine, files: Mapping[int, str], per_file: int) -> tuple[MalformedRow, ...]:
    rows = engine.rows(
        "SELECT src, line, reason FROM (SELECT *, row_number() OVER"
        " (PARTITION BY src ORDER BY line) AS n FROM malformed)"
        f" WHERE n <= {int(per_file)} ORDER BY src, line"
    )
    return tuple(
        MalformedRow(files.get(src, "?"), int(line), str(reason)) for src, line, reason in rows
    )
