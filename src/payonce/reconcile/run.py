"""One reconciliation from files to a :class:`~payonce.reconcile.report.Report`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from payonce.errors import ConfigError
from payonce.reconcile.analysis import AnalysisSettings, analyse, malformed_listing
from payonce.reconcile.engine import Engine, EngineSettings, ProgressSink
from payonce.reconcile.exports import (
    Export,
    create_export_tables,
    detect_export,
    load_export,
)
from payonce.reconcile.keymap import KeyMap
from payonce.reconcile.loading import (
    LoadedSource,
    Source,
    create_tables,
    load_source,
    resolve_columns,
)
from payonce.reconcile.report import InputSummary, Report
from payonce.reconcile.schema import (
    CALL_FIELDS,
    PAYONCE,
    REQUEST_JOIN_CALL_FIELDS,
    STATED_COST_CALL_FIELDS,
    Side,
    SourceFormat,
)
from payonce.reconcile.sniff import Sniffed, detect_format, read_head, sniff
from payonce.reconcile.stated import stated_costs
from payonce.reconcile.usage_analysis import analyse_usage, load_calls, prepare_usage
from payonce.reconcile.usage_report import UsageReport

__all__ = ["ReconcileOptions", "reconcile", "reconcile_usage"]

USAGE_CALL_FIELDS = frozenset(CALL_FIELDS) - {
    "provider_request_id",
    "price_source",
    "list_cost_usd",
}
# The payonce call log's columns of a request's business scenario and endpoint, read as
# the tag and the endpoint by default when its head has them (docs/reconcile.md).
_SCENARIO_COLUMN = "scenario"
_ENDPOINT_COLUMN = "endpoint"


@dataclass(frozen=True, slots=True)
class ReconcileOptions:
    """How to read the inputs and how to analyse them.

    ``calls_format``/``bill_format`` force a format instead of detecting it;
    ``calls_map``/``bill_map`` read fields from other columns.
    """

    calls_format: str | None = None
    bill_format: str | None = None
    calls_map: Mapping[str, str] = field(default_factory=dict)
    bill_map: Mapping[str, str] = field(default_factory=dict)
    engine: EngineSettings = field(default_factory=EngineSettings)
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)
    key_map: KeyMap | None = None
    token_tolerance: float = 0.01


def reconcile(
    calls: Sequence[Path],
    bills: Sequence[Path],
    options: ReconcileOptions | None = None,
    progress: ProgressSink | None = None,
) -> Report | UsageReport:
    """Join call logs with bills and compute every figure of the report.

    Bills that are per-request (a ledger, spend logs, invocation logs) are joined
    by request id (a :class:`Report`); providers' usage and cost reports are
    compared bucket by bucket (a :class:`UsageReport`). One run takes one kind.
    """
    options = options or ReconcileOptions()
    if not calls:
        raise ConfigError("--calls: at least one call log is needed")
    if not bills:
        raise ConfigError("--bill: at least one bill is needed")
    kinds = [detect_export(path, options.bill_format) for path in bills]
    if any(kind is not None for kind in kinds):
        if any(kind is None for kind in kinds):
            per_request = next(
                path for path, kind in zip(bills, kinds, strict=True) if kind is None
            )
            raise ConfigError(
                f"{per_request}: a per-request bill cannot be reconciled in the same run as"
                " usage or cost reports; run them separately"
            )
        exports = [
            Export(len(calls) + i, path, kind, read_head(path)[1])
            for i, (path, kind) in enumerate(zip(bills, kinds, strict=True))
            if kind is not None
        ]
        return reconcile_usage(calls, exports, options, progress)
    if options.key_map is not None:
        raise ConfigError(
            "--key-map: only usage reports are joined by key; this bill has request ids"
        )
    # Every file is sniffed and checked before anything is loaded, so a missing
    # column in the last file fails in a moment, not after minutes of reading.
    sides = [(path, Side.CALLS) for path in calls] + [(path, Side.BILL) for path in bills]
    sniffed_sides = []
    for path, side in sides:
        sniffed = sniff(path)
        forced = options.calls_format if side is Side.CALLS else options.bill_format
        sniffed_sides.append((sniffed, side, detect_format(sniffed, side, forced)))
    defaults = _call_log_defaults(
        [(sniffed, fmt) for sniffed, side, fmt in sniffed_sides if side is Side.CALLS],
        options.calls_map,
    )
    sources = []
    for index, (sniffed, side, fmt) in enumerate(sniffed_sides):
        wanted: frozenset[str] | None = None
        if side is Side.CALLS:
            overrides = options.calls_map
            wanted = REQUEST_JOIN_CALL_FIELDS
            if fmt is PAYONCE:
                fmt = fmt.with_defaults(defaults)
            if "list_cost_usd" in sniffed.columns:
                wanted |= STATED_COST_CALL_FIELDS
        else:
            overrides = options.bill_map
        sources.append(resolve_columns(index, sniffed, side, fmt.with_map(overrides), wanted))

    engine = Engine(options.engine, progress)
    try:
        create_tables(engine)
        loaded: list[LoadedSource] = [load_source(engine, source) for source in sources]
        files = {source.index: source.label for source in sources}
        stated = stated_costs(engine)
        result = analyse(engine, files, options.analysis)
    finally:
        engine.close()
    call_sources = [source for source in sources if source.side is Side.CALLS]
    return Report(
        tag_column=_column_of("tag", call_sources),
        endpoint_column=_column_of("endpoint", call_sources),
        stated_costs=stated,
        totals=result.totals,
        by_model=result.breakdowns["model"],
        by_endpoint=result.breakdowns["endpoint"],
        by_tag=result.breakdowns["tag"],
        daily=result.breakdowns["day"],
        outliers=result.outliers,
        unmatched=result.unmatched,
        inputs=tuple(_summary(item) for item in loaded),
        malformed_rows=result.malformed_rows,
        malformed=result.malformed,
        unbilled_calls=result.unbilled_calls,
        conflicting_request_ids=result.conflicting_request_ids,
        period_start=result.period[0],
        period_end=result.period[1],
        truncated=dict(result.truncated),
    )


def _call_log_defaults(
    calls: Sequence[tuple[Sniffed, SourceFormat]], calls_map: Mapping[str, str]
) -> dict[str, str]:
    """The payonce call log's scenario and endpoint as the tag and the endpoint.

    Read from the first lines of each call log (:func:`sniff`): the scenario when one
    of them names one, the endpoint when the field is there (the gateway writes both
    since issue 34; older lines have neither). A ``--calls-map`` of the field wins.
    """
    logs = [sniffed for sniffed, fmt in calls if fmt is PAYONCE]
    defaults: dict[str, str] = {}
    if "tag" not in calls_map and any(_SCENARIO_COLUMN in log.filled for log in logs):
        defaults["tag"] = _SCENARIO_COLUMN
    if "endpoint" not in calls_map and any(_ENDPOINT_COLUMN in log.columns for log in logs):
        defaults["endpoint"] = _ENDPOINT_COLUMN
    return defaults


def _column_of(name: str, sources: Sequence[Source]) -> str | None:
    """The call-log column ``name`` was read from (several: each, comma-separated)."""
    columns = dict.fromkeys(source.columns[name] for source in sources if name in source.columns)
    return ", ".join(columns) or None


def _summary(item: LoadedSource) -> InputSummary:
    return InputSummary(
        file=item.source.label,
        side=item.source.side.value,
        format=item.source.format.name,
        container=item.source.sniffed.container.value,
        rows=item.rows,
        malformed_rows=item.malformed,
        note=item.note,
    )


def reconcile_usage(
    calls: Sequence[Path],
    exports: Sequence[Export],
    options: ReconcileOptions,
    progress: ProgressSink | None = None,
) -> UsageReport:
    """Compare call logs with usage and cost reports, bucket by bucket."""
    sources = []
    for index, path in enumerate(calls):
        sniffed = sniff(path)
        fmt = detect_format(sniffed, Side.CALLS, options.calls_format)
        # The buckets do not need the provider's request ids.
        fmt = replace(fmt, required=fmt.required - {"provider_request_id"})
        sources.append(
            resolve_columns(
                index, sniffed, Side.CALLS, fmt.with_map(options.calls_map), USAGE_CALL_FIELDS
            )
        )
    engine = Engine(options.engine, progress)
    try:
        create_tables(engine)
        create_export_tables(engine)
        summaries = []
        for export in exports:
            rows, bad, note = load_export(engine, export)
            summaries.append(
                InputSummary(export.label, "bill", export.kind.value, "json", rows, bad, note)
            )
        if not any(export.kind.is_usage for export in exports) and options.key_map:
            raise ConfigError("--key-map: needs a usage report (cost reports are not by key)")
        # The calls are counted into cells as they are read: no line is kept, except
        # those of business ids on several lines, found by a first pass.
        prepared = prepare_usage(engine, options.key_map)
        loaded = load_calls(engine, prepared, sources)
        summaries[:0] = [_summary(item) for item in loaded]
        result = analyse_usage(engine, prepared, options.token_tolerance)
        files = {source.index: source.label for source in sources}
        files.update({export.index: export.label for export in exports})
        malformed_rows = int(engine.scalar("SELECT count(*) FROM malformed") or 0)
        malformed = malformed_listing(engine, files, options.analysis.malformed_listed)
    finally:
        engine.close()
    return UsageReport(
        totals=result.totals,
        by_provider=result.breakdowns["provider"],
        by_model=result.breakdowns["model"],
        by_key=result.breakdowns["key"],
        buckets=result.buckets,
        cost_days=result.cost_days,
        bucket_width_s=result.widths,
        key_column=options.key_map.column if options.key_map else None,
        token_tolerance=options.token_tolerance,
        not_computed=result.not_computed,
        calls_outside=result.calls_outside,
        notes=result.notes,
        inputs=tuple(summaries),
        malformed_rows=malformed_rows,
        malformed=malformed,
        period_start=result.period[0],
        period_end=result.period[1],
    )
