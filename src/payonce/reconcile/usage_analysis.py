"""The aggregated join: the call log bucketed like a provider's usage report, then compared.

::

    usage ──(later file wins on repeats)──► billed cells (provider, bucket, model, key)
    calls ──(first pass: business ids' hashes seen twice)──► repeated
    calls ──(second pass, the report's grid: origin + k x width)──► lines (counted
          per provider, bucket, model and key; per business id too if repeated)
    lines ──(repeated business ids)──► flags (first line, needed call)
    lines + flags ──► logged cells (calls, duplicates, tokens, money, business requests)
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from payonce.errors import ConfigError
from payonce.reconcile import usage_sql
from payonce.reconcile.engine import Engine, sql_string
from payonce.reconcile.keymap import KeyMap
from payonce.reconcile.loading import (
    LoadedSource,
    Source,
    Target,
    load_source,
    scan_source,
)
from payonce.reconcile.prices import bill_price
from payonce.reconcile.usage_report import CostDay, UsageFigures, UsageSlice

__all__ = ["Prepared", "UsageAnalysis", "analyse_usage", "load_calls", "prepare_usage"]

OTHER_KEYS = "(keys not in --key-map)"
UNMAPPED = "(tenants not in --key-map)"
UNKNOWN_MODEL = "(no model)"
# mk and kd are '*' where the report is not grouped by model or key: cells join on
# them, and NULL would never join.
_ALL = "*"
_PER_TOKEN = Decimal(1_000_000)
_NO_COST = "99999999"  # sorts a call of unknown cost after every priced one


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
    """The reports read and checked, and ``lines`` ready to take the calls."""

    key_map: KeyMap | None
    providers: list[tuple[str, bool]]
    notes: tuple[str, ...]
    only_provider: str
    grids: tuple[_Grid, ...]

    def hashes(self, relation: str) -> str:
        """The first pass over one call log's normalized rows: its business ids'
        hashes, appended to ``hashes``."""
        return "INSERT INTO hashes " + usage_sql.HASHES.format(relation=relation)

    def target(self) -> Target:
        """Where the second pass puts one call log's rows: counted into ``counted``.

        A call finds its bucket number by arithmetic on constants (each grid's
        origin and width), not by a join: joining a hundred million calls with
        the buckets was most of the time.
        """
        return Target("counted", self._counted, rows="sum(n)")

    def _counted(self, relation: str) -> str:
        call = usage_sql.CALL.format(relation=relation, grid_columns=self._grid_columns())
        return usage_sql.COUNTED.format(call=call, grid_names=", ".join(self._grid_names()))

    def counted_columns(self) -> str:
        """The columns of ``counted``, whose bucket numbers depend on the grids."""
        grids = ", ".join(f"{name} BIGINT" for name in self._numbers()) or "k_none BIGINT"
        ends = "".join(f", {self._end(grid)} BOOLEAN" for grid in self.grids if grid.short)
        return (
            "src INTEGER, pos BIGINT, reason VARCHAR, endpoint VARCHAR, tag VARCHAR,"
            f" model VARCHAR, {grids}{ends}, flags INTEGER, n BIGINT, input_tokens HUGEINT,"
            " output_tokens HUGEINT, cost DECIMAL(38,10),"
            " repeats STRUCT(b VARCHAR, t TIMESTAMPTZ, c DECIMAL(18,10))[]"
        )

    def lines(self) -> str:
        """The statement placing ``counted``'s groups in providers, buckets and keys."""
        usage = [grid for grid in self.grids if grid.usage]
        costs = [grid for grid in self.grids if not grid.usage]
        gridded = " OR ".join(f"provider = {sql_string(g.provider)}" for g in usage) or "false"
        keyed = "coalesce(k.target, " + sql_string(UNMAPPED) + ")" if self.key_map else "'*'"
        return usage_sql.LINES.format(
            gridded=gridded,
            bucket=self._bucket_of("c.provider", usage),
            cost_bucket=self._bucket_of("c.cost_provider", costs),
            kd=f"CASE WHEN c.provider IS NOT NULL THEN {keyed} END" if self.key_map else "'*'",
            keymap_join="LEFT JOIN keymap k ON k.tenant = c.tag" if self.key_map else "",
            only_provider=self.only_provider,
        )

    def _numbers(self) -> dict[str, tuple[int, int]]:
        """A bucket number column per distinct grid (origin and width)."""
        shapes = dict.fromkeys((grid.origin, grid.width) for grid in self.grids)
        return {f"k{i}": shape for i, shape in enumerate(shapes)}

    def _number(self, grid: _Grid) -> str:
        return next(n for n, shape in self._numbers().items() if shape == (grid.origin, grid.width))

    def _end(self, grid: _Grid) -> str:
        return f"before_end{self.grids.index(grid)}"

    def _grid_names(self) -> list[str]:
        names = list(self._numbers()) or ["k_none"]
        return names + [self._end(grid) for grid in self.grids if grid.short]

    def _grid_columns(self) -> str:
        # ``//`` truncates toward zero: a time before the origin is made negative
        # (outside every grid) by the subtraction.
        columns = [
            f"(epoch_us(c.ts) - {origin * 1_000_000}) // {width * 1_000_000}"
            f" - (epoch_us(c.ts) < {origin * 1_000_000})::BIGINT AS {name}"
            for name, (origin, width) in self._numbers().items()
        ] or ["NULL::BIGINT AS k_none"]
        # A report cut at its end time has a shorter last bucket.
        columns += [
            f"c.ts < {sql_string(grid.end.isoformat())}::TIMESTAMPTZ AS {self._end(grid)}"
            for grid in self.grids
            if grid.short
        ]
        return ", ".join(columns)

    def _bucket_of(self, provider: str, grids: list[_Grid]) -> str:
        """SQL for a group's bucket number k on its provider's grid, NULL outside it."""
        if not grids:
            return "NULL::BIGINT"
        cases = []
        for grid in grids:
            k = f"c.{self._number(grid)}"
            inside = f"{k} BETWEEN {grid.first} AND {grid.last}"
            if grid.short:
                inside += f" AND c.{self._end(grid)}"
            if not grid.contiguous:
                # A report with holes: only the buckets it has (rare: the APIs answer
                # every bucket of the range, empty ones too).
                inside += (
                    f" AND {k} IN (SELECT k FROM report_buckets WHERE provider ="
                    f" {sql_string(grid.provider)} AND usage = {grid.usage})"
                )
            cases.append(f"WHEN {provider} = {sql_string(grid.provider)} AND {inside} THEN {k}")
        return "CASE " + " ".join(cases) + " END"


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

    @property
    def short(self) -> bool:
        """The last bucket ends before a whole width (a report cut at its end time)."""
        end = int(self.end.timestamp())
        return end < self.origin + (self.last + 1) * self.width


def prepare_usage(engine: Engine, key_map: KeyMap | None) -> Prepared:
    """Read the loaded reports' shape (grid, providers) before the calls are read."""
    engine.execute(usage_sql.SETUP, progress="reading the reports")
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
    engine.execute("CREATE TABLE hashes (hb UBIGINT)")
    grids = tuple(
        _Grid(str(p), bool(u), int(o), int(w), int(a), int(b), end, int(n) == int(b) - int(a) + 1)
        for p, u, o, w, a, b, end, n in engine.rows(
            "SELECT provider, usage, g.origin, g.width, min(k), max(k), max(bucket_end), count(*)"
            " FROM report_buckets JOIN grid g USING (provider, usage) GROUP BY ALL"
        )
    )
    prepared = Prepared(
        key_map=key_map,
        providers=providers,
        notes=notes,
        only_provider=sql_string(only[0]) if len(only) == 1 else "NULL",
        grids=grids,
    )
    engine.execute(f"CREATE TABLE counted ({prepared.counted_columns()})")
    return prepared


def load_calls(engine: Engine, prepared: Prepared, sources: Sequence[Source]) -> list[LoadedSource]:
    """Read the call logs twice: the business ids' hashes, then the calls into ``lines``.

    No call is kept: 100 million of them would not fit in memory. The first pass
    finds the business ids on several lines (their hashes), so the second can
    count every other call straight into its cell.
    """
    before = [_stamp(source) for source in sources]
    lenient = [scan_source(engine, source, prepared.hashes) for source in sources]
    engine.execute(usage_sql.REPEATED, progress="finding repeated business ids")
    loaded = [
        load_source(engine, source, into=prepared.target(), lenient=flag)
        for source, flag in zip(sources, lenient, strict=True)
    ]
    for source, stamp in zip(sources, before, strict=True):
        # Lines appended between the passes would be counted without their
        # duplicates: the figures would be wrong, not late.
        if _stamp(source) != stamp:
            raise ConfigError(
                f"{source.label}: changed while it was read (a log still being written?);"
                " reconcile a rotated log, or a copy"
            )
    return loaded


def _stamp(source: Source) -> tuple[int, int]:
    status = source.sniffed.path.stat()
    return status.st_size, status.st_mtime_ns


def analyse_usage(engine: Engine, prepared: Prepared, tolerance: float) -> UsageAnalysis:
    """Compare the calls in ``lines`` with the loaded ``usage`` and ``costs`` tables."""
    key_map, providers = prepared.key_map, prepared.providers
    engine.execute(prepared.lines(), progress="placing the calls")
    engine.execute(usage_sql.FLAGS.format(no_cost=_NO_COST), progress="finding duplicates")
    outside = {
        str(reason): int(count)
        for reason, count in engine.rows(
            "SELECT outside, sum(n) FROM lines WHERE outside IS NOT NULL GROUP BY outside"
        )
    }
    engine.execute(
        usage_sql.CELLS.format(
            key_column=key_map.column if key_map else "api_key_id",
            other_keys=sql_string(OTHER_KEYS),
            unknown=sql_string(UNKNOWN_MODEL),
            logged_sums=", ".join(f"sum({name}) AS {name}" for name in usage_sql.LOGGED),
        ),
        progress="comparing buckets",
    )
    _prices(engine)
    tol = f"{float(tolerance)!r}"
    buckets = _bucket_slices(engine, tol, all(counts for _, counts in providers))
    period_cells = usage_sql.DERIVED.format(relation=usage_sql.PERIOD_CELLS, tolerance=tol)
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
    rows = engine.rows(usage_sql.OFF_GRID)
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
    derived = usage_sql.DERIVED.format(relation="SELECT * FROM cells", tolerance=tol)
    rows = engine.dicts(
        "SELECT b.bucket_start AS key, d.* FROM (SELECT DISTINCT bucket_start FROM"
        f" report_buckets WHERE usage) b LEFT JOIN (SELECT bucket, {usage_sql.SUMS}"
        f" FROM ({derived}) GROUP BY bucket) d ON d.bucket = b.bucket_start"
        " ORDER BY b.bucket_start"
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
        f"SELECT GROUPING(provider, mk, kd) AS g, provider, mk, kd, {usage_sql.SUMS} FROM period"
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
    for provider, start, billed, logged in engine.rows(usage_sql.COST_DAYS):
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
