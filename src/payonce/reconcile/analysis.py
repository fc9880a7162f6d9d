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

from payonce.errors import PayonceError
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

_SETUP = """
-- Text attributes travel through the big aggregations as 64-bit hashes: carrying
-- strings through ten million groups is several times slower. ``dictionary``
-- maps them back, and would show a collision (never silently merged). The names
-- are few, so they are gathered first (a distinct per column) and hashed after;
-- the per-row hashes (m, e, t) are computed while loading.
-- A UTC day as a day number: casting each TIMESTAMPTZ to a DATE goes through the
-- time zone machinery and took a third of the figures' time.
CREATE MACRO day(ts) AS floor(epoch_us(ts) / 86400000000)::INTEGER;
CREATE TABLE dictionary AS
SELECT h(s) AS h, s FROM (
    SELECT DISTINCT model AS s FROM calls
    UNION SELECT DISTINCT endpoint FROM calls
    UNION SELECT DISTINCT tag FROM calls
    UNION SELECT DISTINCT model FROM bill
    UNION SELECT DISTINCT endpoint FROM bill
) WHERE s IS NOT NULL;
"""


def _seen_twice(name: str, key: str, table: str, alias: str) -> str:
    """``CREATE`` table ``name`` of the ``key`` hashes on several rows of ``table``.

    Found by sorting the hashes and comparing neighbours: nearly every id is on one
    line, and a hash table of a hundred million distinct keys spilled at 4 GiB where
    the sort did not.
    """
    return (
        f"CREATE TEMP TABLE {name} AS SELECT DISTINCT {key} AS {alias} FROM"
        f" (SELECT {key}, lag({key}) OVER (ORDER BY {key}) AS prev FROM {table}"
        f" WHERE {key} IS NOT NULL) WHERE {key} = prev;\n"
    )


# Only the ids on several lines are grouped; the others join as they are (see
# _GENERATIONS).
_LINKS = (
    _seen_twice("multi_calls", "kp", "calls", "pid")
    + _seen_twice("multi_lines", "kp", "bill", "gid")
    + _seen_twice("multi_business", "kb", "calls", "kb")
    + """
-- A request id on several call lines (a replay that names it, a log read twice):
-- pick its business request deterministically, and count ids whose lines disagree.
CREATE TEMP TABLE multi_links AS
SELECT kp AS pid, count(*) AS n, min(kb) AS kb,
       bool_or(unkeyed_retry) AS unkeyed_retry, min(m) AS model, min(e) AS endpoint,
       min(t) AS tag, min(ts) AS ts, min(kb) <> max(kb) AS conflicting
FROM calls SEMI JOIN multi_calls ON kp = multi_calls.pid
GROUP BY kp;

-- A business id on one line is a business request as it stands; only the others
-- are grouped.
CREATE TABLE business AS
SELECT kb, 1 AS calls, success, ts, m AS model, e AS endpoint, t AS tag
FROM calls ANTI JOIN multi_business USING (kb) WHERE kb IS NOT NULL
UNION ALL
SELECT kb, count(*), bool_or(success), min(ts), min(m), min(e), min(t)
FROM calls SEMI JOIN multi_business USING (kb) GROUP BY kb;
"""
)

_GENERATIONS = """
CREATE TABLE generations AS
WITH links AS (
    SELECT kp AS pid, kb, unkeyed_retry, m AS model, e AS endpoint, t AS tag, ts
    FROM calls ANTI JOIN multi_calls ON kp = multi_calls.pid
    WHERE kp IS NOT NULL
    UNION ALL
    SELECT pid, kb, unkeyed_retry, model, endpoint, tag, ts FROM multi_links
), grouped AS (
    SELECT kp AS gid, 1 AS lines, cost_usd AS cost, m AS model, e AS endpoint, ts, src
    FROM bill ANTI JOIN multi_lines ON kp = multi_lines.gid
    WHERE kp IS NOT NULL
    UNION ALL
    SELECT kp, count(*), sum(cost_usd), min(m), min(e), min(ts), min(src)
    FROM bill SEMI JOIN multi_lines ON kp = multi_lines.gid
    GROUP BY kp
    UNION ALL
    -- A bill line without a request id is a generation of its own, matched by nothing.
    SELECT md5_number('#' || src || ':' || coalesce(pos::VARCHAR, gen_random_uuid()::VARCHAR)),
           1, cost_usd, m, e, ts, src
    FROM bill WHERE kp IS NULL
)
SELECT g.gid, l.pid IS NOT NULL AS matched, g.lines, g.cost, g.src,
       coalesce(g.model, l.model) AS model,
       coalesce(l.endpoint, g.endpoint) AS endpoint,
       l.tag, coalesce(g.ts, l.ts) AS ts, l.kb,
       coalesce(l.kb IS NULL AND l.unkeyed_retry, false) AS unkeyed_retry
FROM grouped g LEFT JOIN links l ON g.gid = l.pid;
"""

_DUPLICATES = """
-- Business requests billed more than once, and the generation each of them needed:
-- the cheapest (then the earliest, then by request id hash). All the others are
-- duplicates, so the waste is a lower bound whichever answer the client used.
-- Two generations of a business request need two of its calls (each generation is
-- named by a call of its own), so only requests with several calls are ranked.
CREATE TEMP TABLE candidates AS
SELECT kb, gid, cost, ts, model, endpoint, tag FROM generations
SEMI JOIN multi_business USING (kb);

-- The generations a business request did not need. They are counted as duplicates
-- beside the generations (see _GENERATION_FIGURES) instead of flagged in place: an
-- UPDATE of a hundred million rows cost more than the few it changes.
CREATE TEMP TABLE dupes AS
SELECT * EXCLUDE (r) FROM (
    SELECT *, row_number() OVER (PARTITION BY kb ORDER BY cost NULLS LAST, ts NULLS LAST, gid)
           AS r
    FROM candidates
) WHERE r > 1;
DROP TABLE candidates;
"""

# A business request's model, endpoint, tag and day come from its calls; when the
# calls do not say, from the generation it needed (run only when one does not say).
_BUSINESS_GAPS = "model IS NULL OR endpoint IS NULL OR tag IS NULL OR ts IS NULL"
_FILL_BUSINESS = f"""
UPDATE business SET
    model = coalesce(business.model, kept.model),
    endpoint = coalesce(business.endpoint, kept.endpoint),
    tag = coalesce(business.tag, kept.tag),
    ts = coalesce(business.ts, kept.ts)
FROM (
    SELECT kb, model, endpoint, tag, ts FROM generations
    WHERE NOT unkeyed_retry AND kb IN (SELECT kb FROM business WHERE {_BUSINESS_GAPS})
      AND gid NOT IN (SELECT gid FROM dupes)
) AS kept
WHERE business.kb = kept.kb;
"""

_GENERATION_FIGURES = """
SELECT GROUPING(model, endpoint, tag, day) AS grouping_id, model, endpoint, tag, day,
       coalesce(sum(generation), 0) AS billed_generations,
       coalesce(sum(matched), 0) AS matched_generations,
       coalesce(sum(duplicate), 0) AS duplicate_generations,
       coalesce(sum(unkeyed), 0) AS unkeyed_retry_generations,
       coalesce(sum(lines), 0) AS bill_lines,
       coalesce(sum(unmatched_lines), 0) AS unmatched_bill_lines,
       coalesce(sum(cost), 0) AS total_cost_usd,
       coalesce(sum(wasted), 0) AS wasted_cost_usd,
       coalesce(sum(unmatched_cost), 0) AS unmatched_cost_usd
FROM (SELECT model, endpoint, tag, day(ts) AS day, 1 AS generation,
             matched::INTEGER AS matched, unkeyed_retry::INTEGER AS duplicate,
             unkeyed_retry::INTEGER AS unkeyed, lines,
             lines * (NOT matched)::INTEGER AS unmatched_lines, cost,
             cost * unkeyed_retry::INTEGER AS wasted,
             cost * (NOT matched)::INTEGER AS unmatched_cost
      FROM generations
      -- Each generation a business request did not need, counted once more: it only
      -- adds to the duplicates and the waste.
      UNION ALL
      SELECT model, endpoint, tag, day(ts), 0, 0, 1, 0, 0, 0, 0, cost, 0 FROM dupes)
GROUP BY GROUPING SETS ((), (model), (endpoint), (tag), (day))
"""

_BUSINESS_FIGURES = """
SELECT GROUPING(model, endpoint, tag, day) AS grouping_id, model, endpoint, tag, day,
       count(*) AS business_requests,
       count(*) FILTER (success) AS successful_business_requests
FROM (SELECT model, endpoint, tag, day(ts) AS day, success FROM business)
GROUP BY GROUPING SETS ((), (model), (endpoint), (tag), (day))
"""

_NAMED = """
SELECT f.* REPLACE (m.s AS model, e.s AS endpoint, t.s AS tag,
                   (DATE '1970-01-01' + day)::VARCHAR AS day)
FROM ({figures}) f
LEFT JOIN dictionary m ON f.model = m.h
LEFT JOIN dictionary e ON f.endpoint = e.h
LEFT JOIN dictionary t ON f.tag = t.h
"""

# The few generations a listing shows, with their ids as written: the request id from
# the bill (none for a line without one), the business id from the calls.
_NAMED_IDS = """
WITH o AS ({top})
SELECT o.*, r.id, b.business_id FROM o
LEFT JOIN (SELECT kp, min(provider_request_id) AS id FROM bill
           WHERE kp IN (SELECT gid FROM o) GROUP BY kp) r ON r.kp = o.gid
LEFT JOIN (SELECT kb, min(business_id) AS business_id FROM calls
           WHERE kb IN (SELECT kb FROM o) GROUP BY kb) b ON b.kb = o.kb
ORDER BY {order}
"""

_OUTLIERS = """
CREATE TEMP TABLE outliers AS
WITH norms AS (
    SELECT model, median(cost) AS median, count(*) AS n
    FROM generations WHERE model IS NOT NULL AND cost > 0 GROUP BY model
)
SELECT g.gid, g.kb, d.s AS model, g.cost, g.ts, g.src, norms.median
FROM generations g JOIN norms USING (model) JOIN dictionary d ON g.model = d.h
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
    engine.execute(_SETUP, progress="reading names")
    collisions = engine.scalar("SELECT count(*) - count(DISTINCT h) FROM dictionary")
    if collisions:  # pragma: no cover - a 64-bit hash collision among a few names
        raise PayonceError("two model/endpoint/tag names share a hash; please report this")
    engine.execute(_LINKS, progress="grouping calls")
    conflicting = int(engine.scalar("SELECT count(*) FROM multi_links WHERE conflicting") or 0)
    calls_period = engine.rows("SELECT min(ts), max(ts) FROM calls")[0]
    # The calls' distinct request ids, less those a generation matched (generation ids
    # are unique in ``generations``): the calls no bill line names.
    linked = int(
        engine.scalar(
            "SELECT (SELECT count(*) FROM calls WHERE kp IS NOT NULL)"
            " - (SELECT coalesce(sum(n - 1), 0) FROM multi_links)"
        )
        or 0
    )
    engine.execute(_GENERATIONS, progress="joining calls with the bill")
    # ``calls`` and ``bill`` stay for the few ids the listings name (by hash).
    unbilled = linked - int(engine.scalar("SELECT count(*) FROM generations WHERE matched") or 0)
    engine.execute(_DUPLICATES, progress="finding duplicates")
    if engine.scalar(f"SELECT count(*) FROM business WHERE {_BUSINESS_GAPS}"):
        engine.execute(_FILL_BUSINESS)
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
    outliers = _outliers(engine, files, settings)
    unmatched = _unmatched(engine, files, settings.top)
    return Analysis(
        totals=totals,
        breakdowns=breakdowns,
        truncated=truncated,
        outliers=outliers,
        unmatched=unmatched,
        malformed=malformed_listing(engine, files, settings.malformed_listed),
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
    generation_rows = {
        _slice_key(row): row for row in engine.dicts(_NAMED.format(figures=_GENERATION_FIGURES))
    }
    business_rows = {
        _slice_key(row): row for row in engine.dicts(_NAMED.format(figures=_BUSINESS_FIGURES))
    }
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
            provider_request_id=row["id"],
            business_id=row["business_id"],
            model=row["model"],
            cost_usd=Decimal(row["cost"]),
            model_median_usd=Decimal(row["median"]),
            ts=row["ts"],
            file=files.get(row["src"], "?"),
        )
        for row in engine.dicts(
            _NAMED_IDS.format(
                top="SELECT * FROM outliers ORDER BY cost / median DESC, cost DESC, gid"
                f" LIMIT {int(settings.top)}",
                order="o.cost / o.median DESC, o.cost DESC, o.gid",
            )
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
            provider_request_id=row["id"],
            cost_usd=Decimal(row["cost"] or 0),
            lines=int(row["lines"]),
            model=row["model"],
            ts=row["ts"],
            file=files.get(row["src"], "?"),
        )
        for row in engine.dicts(
            _NAMED_IDS.format(
                top="SELECT gid, kb, cost, lines, d.s AS model, ts, src FROM generations"
                " LEFT JOIN dictionary d ON model = d.h WHERE NOT matched"
                f" ORDER BY cost DESC NULLS LAST, gid LIMIT {int(top)}",
                order="o.cost DESC NULLS LAST, o.gid",
            )
        )
    )


def malformed_listing(
    engine: Engine, files: Mapping[int, str], per_file: int
) -> tuple[MalformedRow, ...]:
    """The first ``per_file`` malformed rows of each file, in line order."""
    rows = engine.rows(
        "SELECT src, line, reason FROM (SELECT *, row_number() OVER"
        " (PARTITION BY src ORDER BY line) AS n FROM malformed)"
        f" WHERE n <= {int(per_file)} ORDER BY src, line"
    )
    return tuple(
        MalformedRow(files.get(src, "?"), int(line or 0), str(reason)) for src, line, reason in rows
    )
