"""One reconciliation from files to a :class:`~payonce.reconcile.report.Report`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from payonce.errors import ConfigError
from payonce.reconcile.analysis import AnalysisSettings, analyse
from payonce.reconcile.engine import Engine, EngineSettings, ProgressSink
from payonce.reconcile.loading import LoadedSource, create_tables, load_source, resolve_columns
from payonce.reconcile.report import InputSummary, Report
from payonce.reconcile.schema import Side
from payonce.reconcile.sniff import detect_format, sniff

__all__ = ["ReconcileOptions", "reconcile"]


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


def reconcile(
    calls: Sequence[Path],
    bills: Sequence[Path],
    options: ReconcileOptions | None = None,
    progress: ProgressSink | None = None,
) -> Report:
    """Join call logs with bills and compute every figure of the report."""
    options = options or ReconcileOptions()
    if not calls:
        raise ConfigError("--calls: at least one call log is needed")
    if not bills:
        raise ConfigError("--bill: at least one bill is needed")
    # Every file is sniffed and checked before anything is loaded, so a missing
    # column in the last file fails in a moment, not after minutes of reading.
    sides = [(path, Side.CALLS) for path in calls] + [(path, Side.BILL) for path in bills]
    sources = []
    for index, (path, side) in enumerate(sides):
        sniffed = sniff(path)
        forced = options.calls_format if side is Side.CALLS else options.bill_format
        fmt = detect_format(sniffed, side, forced)
        overrides = options.calls_map if side is Side.CALLS else options.bill_map
        sources.append(resolve_columns(index, sniffed, side, fmt.with_map(overrides)))

    engine = Engine(options.engine, progress)
    try:
        create_tables(engine)
        loaded: list[LoadedSource] = [load_source(engine, source) for source in sources]
        files = {source.index: source.label for source in sources}
        result = analyse(engine, files, options.analysis)
    finally:
        engine.close()
    return Report(
        totals=result.totals,
        by_model=result.breakdowns["model"],
        by_endpoint=result.breakdowns["endpoint"],
        by_tag=result.breakdowns["tag"],
        daily=result.breakdowns["day"],
        outliers=result.outliers,
        unmatched=result.unmatched,
        inputs=tuple(
            InputSummary(
                file=item.source.label,
                side=item.source.side.value,
                format=item.source.format.name,
                container=item.source.sniffed.container.value,
                rows=item.rows,
                malformed_rows=item.malformed,
                note=item.note,
            )
            for item in loaded
        ),
        malformed_rows=result.malformed_rows,
        malformed=result.malformed,
        unbilled_calls=result.unbilled_calls,
        conflicting_request_ids=result.conflicting_request_ids,
        period_start=result.period[0],
        period_end=result.period[1],
        truncated=dict(result.truncated),
    )
