"""The aggregated join: the call log bucketed like a provider's usage report, then compared.

::

    usage ──(later file wins on repeats)──► billed cells (provider, bucket, model, key)
    calls ──(the report's grid: origin + k x width)──► placed (provider by path,
          upstream call or not, bucket, model and key cells)
    placed ──(business ids on several lines)──► flags (first line, duplicate)
    placed + flags ──► logged cells (calls, duplicates, tokens, money, business requests)
    billed ⟗ logged ──► cells ──► per bucket
                                      └──► per (provider, model, key) over the period
                                           ──► by model, by key, by provider, in all
    costs ──► cost days ◄── the log's cost of the calls in each day

Model names are compared without a date suffix (``gpt-4o-mini-2024-07-18`` and
``gpt-4o-mini`` are one model, ``claude-sonnet-4-20250514`` is
``claude-sonnet-4``): a gateway logs the name asked for, a report the snapshot
that ran. A report not grouped by model is compared in all models at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from payonce.errors import ConfigError
from payonce.reconcile.engine import Engine, sql_string
from payonce.reconcile.keymap import KeyMap
from payonce.reconcile.loading import bill_price
from payonce.reconcile.usage_report import CostDay, UsageFigures, UsageSlice

__all__ = ["Prepared", "UsageAnalysis", "analyse_usage", "prepare_usage"]

OTHER_KEYS = "(keys not in --key-map)"
UNMAPPED = "(tenants not in --key-map)"
UNKNOWN_MODEL = "(no model)"
# mk and kd are '*' where the report is not grouped by model or key: cells join on
# them, and NULL would never join.
_ALL = "*"
_PER_TOKEN = Decimal(1_000_000)
_NO_COST = "99999999"  # sorts a call of unknown cost after every priced one

_SETUP = r"""
CREATE MACRO model_key(x) AS
    regexp_replace(x, '-([0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{8}|latest)$', '');
-- A result repeated across files (two overlapping fetches): the later file wins,
-- since the earlier one may have fetched a bucket that was still filling.
CREATE TABLE billed_rows AS SELECT * FROM usage QUALIFY row_number() OVER (
    PARTITION BY provider, bucket_start, bucket_end, model, api_key_id, project_id,
                 user_id, service_tier, context_window ORDER BY src DESC) = 1;
CREATE TABLE cost_rows AS SELECT * FROM costs QUALIFY row_number() OVER (
    PARTITION BY provider, bucket_start, bucket_end, project_id, line_item, model
    ORDER BY src DESC) = 1;
CREATE TABLE grid AS
SELECT provider, usage, min(epoch(bucket_start))::BIGINT AS origin,
       mode(epoch(bucket_end) - epoch(bucket_start))::BIGINT AS width
FROM (SELECT DISTINCT provider, usage, bucket_start, bucket_end FROM export_buckets)
GROUP BY provider, usage;
-- k numbers a bucket on its grid, so a call finds its bucket by integer arithmetic.
CREATE TABLE report_buckets AS
SELECT b.*, (epoch(b.bucket_start)::BIGINT - g.origin) // g.width AS k
FROM (SELECT DISTINCT provider, usage, bucket_start, bucket_end FROM export_buckets) b
JOIN grid g USING (provider, usage);
"""

_OFF_GRID = """
SELECT b.provider, b.usage, g.width, epoch(b.bucket_end) - epoch(b.bucket_start) AS seen
FROM report_buckets b JOIN grid g USING (provider, usage)
WHERE (epoch(b.bucket_start)::BIGINT - g.origin) % g.width <> 0
   OR epoch(b.bucket_end) - epoch(b.bucket_start) > g.width
   -- Only the last bucket may be shorter: a report cut at its end time.
   OR (epoch(b.bucket_end) - epoch(b.bucket_start) < g.width AND b.bucket_start < (
       SELECT max(bucket_start) FROM report_buckets l
       WHERE l.provider = b.provider AND l.usage = b.usage))
   OR (SELECT count(*) FROM report_buckets o WHERE o.provider = b.provider
       AND o.usage = b.usage AND o.bucket_start = b.bucket_start) > 1
LIMIT 1
"""

# Each call as it is read: which provider, whether it was an upstream call, its
# bucket (the report's grid: origin + k x width) and its key cell. The model is
# kept as written and mapped to its cell only once the calls are counted (a
# regular expression on every call was a third of the time).
_PLACED_COLUMNS = """
src INTEGER, pos BIGINT, reason VARCHAR, hb UBIGINT, business_id VARCHAR,
ts TIMESTAMPTZ, success BOOLEAN, cost DECIMAL(18,10), input_tokens BIGINT,
output_tokens BIGINT, model VARCHAR, provider VARCHAR, cost_provider VARCHAR,
upstream_call BOOLEAN, bucket BIGINT, cost_bucket BIGINT, kd VARCHAR, outside VARCHAR
"""

_PLACED = """
SELECT c.src, c.pos, c.reason, hash(c.business_id) AS hb, c.business_id, c.ts, c.success,
       c.cost_usd AS cost, c.input_tokens, c.output_tokens, c.model, c.provider,
       c.cost_provider,
       -- Sent: it made an upstream attempt (v2), or was forwarded (v1), or the log
       -- does not say (a generic log: every line is a call). Counted: answered 2xx,
       -- or cancelled after it was sent (the provider may have billed it).
       coalesce(c.upstream_attempts > 0, c.outcome IN ('forwarded', 'passthrough', 'error'), true)
       AND CASE WHEN c.upstream_status IS NULL AND c.upstream_cancelled IS NULL
                     AND c.outcome IS NULL THEN c.success
                ELSE coalesce(c.upstream_status BETWEEN 200 AND 299, false)
                     OR coalesce(c.upstream_cancelled, false) END AS upstream_call,
       {bucket} AS bucket,
       {cost_bucket} AS cost_bucket,
       {kd} AS kd,
       CASE WHEN c.provider IS NULL THEN 'endpoints the usage reports do not cover'
            WHEN NOT ({gridded}) THEN 'no usage report for their provider'
            WHEN c.ts IS NULL THEN 'no timestamp'
            WHEN {bucket} IS NULL THEN 'outside the usage reports'' buckets' END AS outside
FROM (
    SELECT *,
           CASE WHEN suffix(endpoint, '/v1/messages') THEN 'anthropic'
                WHEN suffix(endpoint, '/v1/chat/completions')
                  OR suffix(endpoint, '/v1/completions')
                  OR suffix(endpoint, '/v1/responses') THEN 'openai'
                WHEN endpoint IS NULL THEN {only_provider} END AS provider,
           CASE WHEN suffix(endpoint, '/v1/messages') THEN 'anthropic'
                WHEN endpoint IS NULL THEN {only_provider} ELSE 'openai' END AS cost_provider
    FROM ({relation})
) c
{keymap_join}
"""

# Business requests with several lines, found by a 64-bit hash first (integers
# group several times faster than strings; a collision only adds a candidate,
# since ``per_business`` groups the exact ids). For each: its first line (where
# it is counted), whether it succeeded, and the upstream call it needed (the
# cheapest, then the earliest); its other upstream calls are duplicates.
_FLAGS = """
CREATE TEMP TABLE repeated AS
SELECT hb FROM placed WHERE business_id IS NOT NULL GROUP BY hb HAVING count(*) > 1;
CREATE TEMP TABLE multi AS
SELECT rowid AS rid, business_id, ts, cost, upstream_call, success FROM placed
WHERE business_id IS NOT NULL AND hb IN (SELECT hb FROM repeated);
CREATE TEMP TABLE per_business AS
SELECT business_id, arg_min(rid, (ts, rid)) AS first_rid, bool_or(success) AS ok,
       arg_min(rid, (coalesce(cost, {no_cost}), ts, rid)) FILTER (upstream_call) AS kept_rid
FROM multi GROUP BY business_id;
CREATE TEMP TABLE flags AS
SELECT m.rid, m.rid <> b.first_rid AS later, b.ok,
       coalesce(m.upstream_call AND m.rid <> b.kept_rid, false) AS dup
FROM multi m JOIN per_business b USING (business_id);
"""

_CELLS = """
CREATE TABLE logged_models AS
SELECT provider, bucket, NULL::TIMESTAMPTZ AS bucket_start, model, kd,
       count(*) FILTER (upstream_call) AS logged_upstream_calls,
       -- Every retry sent without a key (no business id) duplicates an unnamed call.
       count(*) FILTER (upstream_call AND (business_id IS NULL OR coalesce(f.dup, false)))
           AS duplicate_requests,
       coalesce(sum(input_tokens) FILTER (upstream_call), 0) AS logged_input_tokens,
       coalesce(sum(output_tokens) FILTER (upstream_call), 0) AS logged_output_tokens,
       count(*) FILTER (upstream_call AND input_tokens IS NULL AND output_tokens IS NULL)
           AS unknown_usage_calls,
       coalesce(sum(cost) FILTER (upstream_call), 0) AS logged_cost_usd,
       coalesce(sum(cost) FILTER (upstream_call AND (business_id IS NULL
           OR coalesce(f.dup, false))), 0) AS wasted_cost_usd,
       count(*) FILTER (upstream_call AND cost IS NULL) AS unpriced_calls,
       -- A business request is counted in the bucket of its first line.
       count(*) FILTER (business_id IS NOT NULL AND NOT coalesce(f.later, false))
           AS business_requests,
       count(*) FILTER (business_id IS NOT NULL AND NOT coalesce(f.later, false)
           AND coalesce(f.ok, success)) AS successful_business_requests
FROM (SELECT rowid AS rid, * FROM placed) LEFT JOIN flags f USING (rid)
WHERE outside IS NULL GROUP BY ALL;

-- Bucket numbers back to the buckets' starts, now that there are few rows.
UPDATE logged_models SET bucket_start = b.bucket_start
FROM report_buckets b WHERE b.usage AND b.provider = logged_models.provider
    AND b.k = logged_models.bucket;

CREATE TABLE model_keys AS
SELECT model, coalesce(model_key(model), {unknown}) AS mk
FROM (SELECT DISTINCT model FROM logged_models UNION SELECT DISTINCT model FROM billed_rows);

CREATE TABLE logged AS
SELECT provider, bucket_start AS bucket, CASE WHEN p.by_model THEN m.mk ELSE '*' END AS mk, kd,
       {logged_sums}
FROM logged_models l JOIN model_keys m ON m.model IS NOT DISTINCT FROM l.model
JOIN providers p USING (provider) GROUP BY ALL;

CREATE TABLE billed AS
SELECT u.provider, u.bucket_start AS bucket,
       CASE WHEN p.by_model THEN m.mk ELSE '*' END AS mk,
       CASE WHEN p.keyed THEN CASE WHEN u.{key_column} IN (SELECT target FROM keymap)
            THEN u.{key_column} ELSE {other_keys} END ELSE '*' END AS kd,
       sum(u.requests) AS billed_requests,
       sum(u.input_tokens) AS billed_input_tokens,
       sum(u.cached_input_tokens) AS billed_cached_input_tokens,
       sum(u.output_tokens) AS billed_output_tokens
FROM billed_rows u JOIN providers p USING (provider)
JOIN model_keys m ON m.model IS NOT DISTINCT FROM u.model GROUP BY ALL;

CREATE TABLE cells AS
SELECT provider, bucket, mk, kd,
       CASE WHEN p.counts_requests THEN coalesce(b.billed_requests, 0) END AS billed_requests,
       coalesce(b.billed_input_tokens, 0) AS billed_input_tokens,
       coalesce(b.billed_cached_input_tokens, 0) AS billed_cached_input_tokens,
       coalesce(b.billed_output_tokens, 0) AS billed_output_tokens,
       coalesce(l.logged_upstream_calls, 0) AS logged_upstream_calls,
       coalesce(l.duplicate_requests, 0) AS duplicate_requests,
       coalesce(l.logged_input_tokens, 0) AS logged_input_tokens,
       coalesce(l.logged_output_tokens, 0) AS logged_output_tokens,
       coalesce(l.unknown_usage_calls, 0) AS unknown_usage_calls,
       coalesce(l.logged_cost_usd, 0) AS logged_cost_usd,
       coalesce(l.wasted_cost_usd, 0) AS wasted_cost_usd,
       coalesce(l.unpriced_calls, 0) AS unpriced_calls,
       coalesce(l.business_requests, 0) AS business_requests,
       coalesce(l.successful_business_requests, 0) AS successful_business_requests
FROM billed b
FULL JOIN logged l USING (provider, bucket, mk, kd)
JOIN providers p USING (provider);
"""

_LOGGED = (
    "logged_upstream_calls",
    "duplicate_requests",
    "logged_input_tokens",
    "logged_output_tokens",
    "unknown_usage_calls",
    "logged_cost_usd",
    "wasted_cost_usd",
    "unpriced_calls",
    "business_requests",
    "successful_business_requests",
)

_RAW = (
    "billed_requests",
    "billed_input_tokens",
    "billed_cached_input_tokens",
    "billed_output_tokens",
    *_LOGGED,
)

# The differences of one cell, from its raw sums and its model's price.
_DERIVED = """
SELECT r.*,
       CASE WHEN billed_requests IS NOT NULL
            THEN greatest(0, billed_requests - logged_upstream_calls) END AS unexplained_requests,
       CASE WHEN billed_requests IS NOT NULL
            THEN greatest(0, logged_upstream_calls - billed_requests) END AS unbilled_calls,
       -- Token counts of the provider and the gateway may disagree a little: within the
       -- tolerance that is accounting, not usage, unless the provider billed more
       -- requests than were sent (then the difference is those requests' tokens).
       coalesce(billed_requests > logged_upstream_calls, false) AS more_billed,
       more_billed OR abs(billed_input_tokens - logged_input_tokens)
           > {tolerance} * billed_input_tokens AS in_off,
       more_billed OR abs(billed_output_tokens - logged_output_tokens)
           > {tolerance} * billed_output_tokens AS out_off,
       CASE WHEN in_off THEN greatest(0, billed_input_tokens - logged_input_tokens) ELSE 0 END
           AS unexplained_input_tokens,
       CASE WHEN out_off THEN greatest(0, billed_output_tokens - logged_output_tokens) ELSE 0 END
           AS unexplained_output_tokens,
       CAST((billed_input_tokens - billed_cached_input_tokens) * pr.input
            + billed_cached_input_tokens * pr.cached + billed_output_tokens * pr.output
            AS DECIMAL(18,10)) AS billed_cost_usd,
       CAST(unexplained_input_tokens * pr.input + unexplained_output_tokens * pr.output
            AS DECIMAL(18,10)) AS unexplained_cost_usd,
       coalesce(unexplained_requests > 0 OR unbilled_calls > 0, false) OR in_off OR out_off
           AS flagged
FROM ({relation}) r LEFT JOIN prices pr USING (mk)
"""

_SUMS = ", ".join(
    [f"sum({name}) AS {name}" for name in _RAW if name != "billed_requests"]
    + [
        # Unknown in any part is unknown in the sum, never a partial number.
        f"CASE WHEN bool_and({name} IS NOT NULL) THEN sum({name}) END AS {name}"
        for name in (
            "billed_requests",
            "unexplained_requests",
            "unbilled_calls",
            "billed_cost_usd",
            "unexplained_cost_usd",
        )
    ]
    + [
        "sum(unexplained_input_tokens) AS unexplained_input_tokens",
        "sum(unexplained_output_tokens) AS unexplained_output_tokens",
        "bool_or(flagged) AS flagged",
    ]
)

_PERIOD_CELLS = (
    "SELECT provider, mk, kd, "
    + ", ".join(
        f"CASE WHEN bool_and({name} IS NOT NULL) THEN sum({name}) END AS {name}"
        if name == "billed_requests"
        else f"sum({name}) AS {name}"
        for name in _RAW
    )
    + " FROM cells GROUP BY provider, mk, kd"
)

_COST_DAYS = """
WITH days AS (
    SELECT provider, bucket_start, bucket_end, sum(amount_usd) AS billed
    FROM cost_rows GROUP BY ALL
), spent AS (
    SELECT b.provider, b.bucket_start, s.logged
    FROM (SELECT cost_provider, cost_bucket, sum(cost) AS logged FROM placed
          WHERE upstream_call AND cost_bucket IS NOT NULL GROUP BY ALL) s
    JOIN report_buckets b ON NOT b.usage AND b.provider = s.cost_provider
        AND b.k = s.cost_bucket
)
SELECT b.provider, b.bucket_start, coalesce(d.billed, 0) AS billed,
       coalesce(s.logged, 0) AS logged
FROM (SELECT * FROM report_buckets WHERE NOT usage) b
LEFT JOIN days d USING (provider, bucket_start)
LEFT JOIN spent s USING (provider, bucket_start)
ORDER BY b.bucket_start, b.provider
"""


@dataclass(frozen=True, slots=True)
class UsageAnalysis:
    """What :func:`analyse_usage` returns; ``run`` adds the inputs."""

    totals: UsageFigures
    breakdowns: Mapping[str, tuple[UsageSlice, ...]]
    buckets: tuple[UsageSlice, ...]
    cost_days: tuple[CostDay, ...]
    widths: dict[str, int]
    not_computed: dict[str, str]
    calls_outside: dict[str, int]
    notes: tuple[str, ...]
    period: tuple[Any, Any]


@dataclass(frozen=True, slots=True)
class Prepared:
    """The reports read and checked, and ``placed`` ready to take the calls."""

    key_map: KeyMap | None
    providers: list[tuple[str, bool]]
    notes: tuple[str, ...]
    only_provider: str
    grids: tuple[_Grid, ...]

    def place(self, relation: str) -> str:
        """The SELECT appending one call log's normalized rows to ``placed``.

        A call finds its bucket by arithmetic on constants (the report's origin and
        width), not by a join: joining a hundred million calls with the buckets was
        most of the time.
        """
        usage = [grid for grid in self.grids if grid.usage]
        costs = [grid for grid in self.grids if not grid.usage]
        gridded = " OR ".join(f"c.provider = {sql_string(g.provider)}" for g in usage) or "false"
        keyed = "coalesce(k.target, " + sql_string(UNMAPPED) + ")" if self.key_map else "'*'"
        join = "LEFT JOIN keymap k ON k.tenant = c.tag" if self.key_map else ""
        return _PLACED.format(
            relation=relation,
            only_provider=self.only_provider,
            bucket=_bucket_of("c.provider", usage),
            cost_bucket=_bucket_of("c.cost_provider", costs),
            gridded=gridded,
            kd=f"CASE WHEN c.provider IS NOT NULL THEN {keyed} END" if self.key_map else "'*'",
            keymap_join=join,
        )


@dataclass(frozen=True, slots=True)
class _Grid:
    """One report's buckets: ``origin + k x width`` seconds, for k in ``first..last``."""

    provider: str
    usage: bool
    origin: int
    width: int
    first: int
    last: int
    end: Any  # the last bucket's end (it may be shorter)
    contiguous: bool


def _bucket_of(provider: str, grids: list[_Grid]) -> str:
    """SQL for a call's bucket number k on its provider's grid, NULL outside it."""
    if not grids:
        return "NULL::BIGINT"
    cases = []
    for grid in grids:
        k = f"(epoch_us(c.ts) - {grid.origin * 1_000_000}) // {grid.width * 1_000_000}"
        inside = (
            f"c.ts >= to_timestamp({grid.origin}) AND c.ts < {sql_string(grid.end.isoformat())}"
            "::TIMESTAMPTZ"
        )
        if not grid.contiguous:
            # A report with holes: only the buckets it has (rare: the APIs answer
            # every bucket of the range, empty ones too).
            inside += (
                f" AND {k} IN (SELECT k FROM report_buckets WHERE provider ="
                f" {sql_string(grid.provider)} AND usage = {grid.usage})"
            )
        cases.append(f"WHEN {provider} = {sql_string(grid.provider)} AND {inside} THEN {k}")
    return "CASE " + " ".join(cases) + " END"


def prepare_usage(engine: Engine, key_map: KeyMap | None) -> Prepared:
    """Read the loaded reports' shape (grid, providers) before the calls are read."""
    engine.execute(_SETUP, progress="reading the reports")
    notes = _repeats(engine)
    _check_grid(engine)
    providers = _providers(engine, key_map)
    only = [name for name, _ in providers]
    engine.execute(
        "CREATE TABLE keymap (tenant VARCHAR, target VARCHAR)"
        + (
            "; INSERT INTO keymap VALUES "
            + ", ".join(f"({sql_string(t)}, {sql_string(k)})" for t, k in key_map.tenants.items())
            if key_map
            else ""
        )
    )
    engine.execute(f"CREATE TABLE placed ({_PLACED_COLUMNS})")
    grids = tuple(
        _Grid(str(p), bool(u), int(o), int(w), int(a), int(b), end, int(n) == int(b) - int(a) + 1)
        for p, u, o, w, a, b, end, n in engine.rows(
            "SELECT provider, usage, g.origin, g.width, min(k), max(k), max(bucket_end), count(*)"
            " FROM report_buckets JOIN grid g USING (provider, usage) GROUP BY ALL"
        )
    )
    return Prepared(
        key_map=key_map,
        providers=providers,
        notes=notes,
        only_provider=sql_string(only[0]) if len(only) == 1 else "NULL",
        grids=grids,
    )


def analyse_usage(engine: Engine, prepared: Prepared, tolerance: float) -> UsageAnalysis:
    """Compare the calls in ``placed`` with the loaded ``usage`` and ``costs`` tables."""
    key_map, providers = prepared.key_map, prepared.providers
    engine.execute(_FLAGS.format(no_cost=_NO_COST), progress="finding duplicates")
    outside = {
        str(reason): int(count)
        for reason, count in engine.rows(
            "SELECT outside, count(*) FROM placed WHERE outside IS NOT NULL GROUP BY outside"
        )
    }
    engine.execute(
        _CELLS.format(
            key_column=key_map.column if key_map else "api_key_id",
            other_keys=sql_string(OTHER_KEYS),
            unknown=sql_string(UNKNOWN_MODEL),
            logged_sums=", ".join(f"sum({name}) AS {name}" for name in _LOGGED),
        ),
        progress="comparing buckets",
    )
    _prices(engine)
    tol = f"{float(tolerance)!r}"
    buckets = _bucket_slices(engine, tol, all(counts for _, counts in providers))
    period_cells = _DERIVED.format(relation=_PERIOD_CELLS, tolerance=tol)
    engine.execute(f"CREATE TABLE period AS {period_cells}")
    totals, breakdowns = _period_slices(engine)
    cost_days = _cost_days(engine, tolerance)
    span = engine.rows("SELECT min(bucket_start), max(bucket_end) FROM report_buckets")[0]
    widths = {
        f"{provider}-{'usage' if usage else 'costs'}": int(width)
        for provider, usage, width in engine.rows("SELECT provider, usage, width FROM grid")
    }
    return UsageAnalysis(
        totals=totals,
        breakdowns=breakdowns,
        buckets=buckets,
        cost_days=cost_days,
        widths=widths,
        not_computed=_not_computed(engine, providers),
        calls_outside=outside,
        notes=prepared.notes,
        period=(span[0], span[1]),
    )


def _repeats(engine: Engine) -> tuple[str, ...]:
    dropped = int(
        engine.scalar(
            "SELECT (SELECT count(*) FROM usage) - (SELECT count(*) FROM billed_rows)"
            " + (SELECT count(*) FROM costs) - (SELECT count(*) FROM cost_rows)"
        )
        or 0
    )
    if not dropped:
        return ()
    return (f"{dropped} results of a bucket appear in several files: the last file's are used",)


def _check_grid(engine: Engine) -> None:
    rows = engine.rows(_OFF_GRID)
    if rows:
        provider, usage, width, seen = rows[0]
        kind = "usage" if usage else "cost"
        raise ConfigError(
            f"the {provider} {kind} reports mix bucket widths ({int(width)} s and"
            f" {int(seen)} s): reconcile one width at a time"
        )


def _providers(engine: Engine, key_map: KeyMap | None) -> list[tuple[str, bool]]:
    """Create ``providers``: per provider, how its reports can be compared."""
    rows = engine.rows(
        "SELECT provider, count(model) > 0, count(api_key_id) > 0, count(project_id) > 0,"
        " count(requests) = count(*) AND count(*) > 0"
        " FROM billed_rows GROUP BY provider"
    )
    seen = {row[0]: row for row in rows}
    for (provider,) in engine.rows("SELECT DISTINCT provider FROM grid WHERE usage"):
        seen.setdefault(provider, (provider, True, False, False, provider == "openai"))
    values = []
    for provider, by_model, by_key, by_project, counts in seen.values():
        keyed = key_map is not None
        if key_map is not None and not (by_key if key_map.column == "api_key_id" else by_project):
            column = "api_key_id" if key_map.column == "api_key_id" else "project_id/workspace_id"
            if rows and provider in {row[0] for row in rows}:
                raise ConfigError(
                    f"--key-map: the {provider} usage report is not grouped by {column}"
                    f" (fetch it with group_by={column.split('/')[0]})"
                )
        values.append(f"({sql_string(provider)}, {bool(by_model)}, {keyed}, {bool(counts)})")
    engine.execute(
        "CREATE TABLE providers (provider VARCHAR, by_model BOOLEAN, keyed BOOLEAN,"
        " counts_requests BOOLEAN)"
        + (f"; INSERT INTO providers VALUES {', '.join(values)}" if values else "")
    )
    return [(str(provider), bool(counts)) for provider, _, _, _, counts in seen.values()]


def _prices(engine: Engine) -> None:
    """``prices``: USD per token of each compared model, from the price table."""
    names: dict[str, list[str]] = {}
    for mk, name in engine.rows(
        "SELECT DISTINCT mk, model FROM (SELECT model_key(model) AS mk, model FROM billed_rows"
        " UNION ALL SELECT mk, model FROM model_keys) WHERE model IS NOT NULL"
    ):
        names.setdefault(str(mk), []).append(str(name))
    rows = []
    for mk, candidates in sorted(names.items()):
        price = next((p for p in map(bill_price, [mk, *sorted(candidates)]) if p is not None), None)
        if price is None:
            continue
        rates = [
            Decimal(str(v)) / _PER_TOKEN for v in (price.input, price.cached_input, price.output)
        ]
        rows.append(f"({sql_string(mk)}, " + ", ".join(f"{rate:f}" for rate in rates) + ")")
    engine.execute(
        "CREATE TABLE prices (mk VARCHAR, input DECIMAL(18,15), cached DECIMAL(18,15),"
        " output DECIMAL(18,15))"
        + (f"; INSERT INTO prices VALUES {', '.join(rows)}" if rows else "")
    )


def _bucket_slices(engine: Engine, tol: str, counted: bool) -> tuple[UsageSlice, ...]:
    derived = _DERIVED.format(relation="SELECT * FROM cells", tolerance=tol)
    rows = engine.dicts(
        f"SELECT b.bucket_start AS key, d.* FROM (SELECT DISTINCT bucket_start FROM"
        f" report_buckets WHERE usage) b LEFT JOIN (SELECT bucket, {_SUMS} FROM ({derived})"
        " GROUP BY bucket) d ON d.bucket = b.bucket_start ORDER BY b.bucket_start"
    )
    return tuple(UsageSlice(_utc(row["key"]), _figures(row, counted=counted)) for row in rows)


def _utc(moment: Any) -> str:
    return str(moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))


def _figures(row: dict[str, Any], *, counted: bool) -> UsageFigures:
    if row["bucket"] is None:
        # A bucket with nothing billed and nothing logged in it.
        zero = 0 if counted else None
        return UsageFigures(billed_requests=zero, unexplained_requests=zero, unbilled_calls=zero)
    return UsageFigures.from_row(row)


def _period_slices(
    engine: Engine,
) -> tuple[UsageFigures, dict[str, tuple[UsageSlice, ...]]]:
    rows = engine.dicts(
        f"SELECT GROUPING(provider, mk, kd) AS g, provider, mk, kd, {_SUMS} FROM period"
        " GROUP BY GROUPING SETS ((), (provider), (mk), (kd))"
    )
    totals = UsageFigures()
    found: dict[str, list[UsageSlice]] = {"provider": [], "model": [], "key": []}
    for row in rows:
        figures = UsageFigures.from_row(row)
        grouping = int(row["g"])
        if grouping == 0b111:
            totals = figures
        elif grouping == 0b011:
            found["provider"].append(UsageSlice(str(row["provider"]), figures))
        elif grouping == 0b101 and row["mk"] != _ALL:
            found["model"].append(UsageSlice(str(row["mk"]), figures))
        elif grouping == 0b110 and row["kd"] != _ALL:
            found["key"].append(UsageSlice(str(row["kd"]), figures))
    ordered = {
        name: tuple(
            sorted(
                slices,
                key=lambda s: (
                    -(s.figures.billed_cost_usd or 0),
                    -s.figures.billed_input_tokens,
                    s.key,
                ),
            )
        )
        for name, slices in found.items()
    }
    return totals, ordered


def _cost_days(engine: Engine, tolerance: float) -> tuple[CostDay, ...]:
    days = []
    for provider, start, billed, logged in engine.rows(_COST_DAYS):
        billed, logged = Decimal(billed), Decimal(logged)
        flagged = abs(billed - logged) > Decimal(repr(tolerance)) * billed
        unexplained = max(Decimal(0), billed - logged) if flagged else Decimal(0)
        days.append(CostDay(str(provider), start, billed, logged, unexplained, flagged))
    return tuple(days)


def _not_computed(engine: Engine, providers: list[tuple[str, bool]]) -> dict[str, str]:
    missing: dict[str, str] = {}
    silent = [name for name, counts in providers if not counts]
    if silent:
        why = f"the {', '.join(silent)} usage report gives no request count"
        for name in (
            "billed_requests",
            "unexplained_requests",
            "unbilled_calls",
            "duplicate_ratio",
        ):
            missing[name] = why
        missing["duplicate_ratio"] += "; duplicate_cost_ratio compares money instead"
    unpriced = [
        str(mk)
        for (mk,) in engine.rows(
            "SELECT DISTINCT mk FROM period WHERE mk <> '*' AND mk NOT IN (SELECT mk FROM prices)"
        )
    ]
    if unpriced:
        why = f"no price for {', '.join(sorted(unpriced))} in the price table"
        missing["billed_cost_usd"] = why
        missing["unexplained_cost_usd"] = why
    if not engine.scalar("SELECT count(*) FROM grid WHERE usage"):
        missing["requests and tokens"] = "no usage report was given, only cost reports"
    return missing
