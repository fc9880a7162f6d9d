"""The providers' aggregated reports as bills: OpenAI's and Anthropic's usage and cost pages.

OpenAI (``GET /v1/organization/usage/completions``, ``/v1/organization/costs``) and
Anthropic (``GET /v1/organizations/usage_report/messages``, ``/cost_report``) bill
no request ids: they answer pages of time buckets, each with results grouped by
model, API key, project or workspace. A file holds those page objects as the API
returned them: one JSON document, a JSON array of pages, or one page per line
(what ``payonce reconcile --fetch --save`` writes); gzip is accepted.

Which report a file is comes from its content (:func:`detect_export`), and it is
loaded into one of three tables:

- ``usage``: one row per result of a usage bucket, its tokens and (OpenAI only)
  its request count. ``input_tokens`` counts every input token: OpenAI's
  ``input_tokens`` already includes ``input_cached_tokens``; Anthropic's
  ``uncached_input_tokens``, ``cache_read_input_tokens`` and both
  ``cache_creation`` counts are added up, as the gateway's call log does.
- ``costs``: one row per result of a cost bucket, in USD (Anthropic's
  ``amount`` is a decimal string in cents; OpenAI's ``amount.value`` is dollars).
- ``export_buckets``: every bucket of every page, empty ones too: an empty bucket
  says "nothing was billed then", which is not the same as "not in the export".

Decisions, each also in docs/reconcile.md:

- OpenAI results with ``batch: true`` are left out (the Batch API is not called
  through a gateway), counted in the input's note.
- A result repeated exactly (overlapping exports, a page saved twice) counts once,
  and the note says how many were dropped.
- A file whose last page says ``has_more: true`` is missing pages; the note says so
  (another file may hold them).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path

from payonce.errors import ConfigError
from payonce.reconcile.engine import Engine, sql_string
from payonce.reconcile.prices import MONEY
from payonce.reconcile.sniff import read_head

__all__ = ["EXPORT_NAMES", "Export", "ExportKind", "create_export_tables", "detect_export"]


class ExportKind(enum.Enum):
    """The four aggregated reports (their ``--bill-format`` names)."""

    OPENAI_USAGE = "openai-usage"
    OPENAI_COSTS = "openai-costs"
    ANTHROPIC_USAGE = "anthropic-usage"
    ANTHROPIC_COSTS = "anthropic-costs"

    @property
    def provider(self) -> str:
        return self.value.split("-", 1)[0]

    @property
    def is_usage(self) -> bool:
        return self.value.endswith("-usage")


EXPORT_NAMES = tuple(kind.value for kind in ExportKind)

# Marks in a file's head, most specific first. A result object names itself in
# OpenAI's reports; Anthropic's are told apart by their fields.
_MARKS: tuple[tuple[re.Pattern[str], ExportKind], ...] = (
    (re.compile(r'"organization\.usage\.completions\.result"'), ExportKind.OPENAI_USAGE),
    (re.compile(r'"num_model_requests"\s*:'), ExportKind.OPENAI_USAGE),
    (re.compile(r'"organization\.costs\.result"'), ExportKind.OPENAI_COSTS),
    (re.compile(r'"uncached_input_tokens"\s*:'), ExportKind.ANTHROPIC_USAGE),
)
_ANTHROPIC_BUCKET = re.compile(r'"starting_at"\s*:')
_OPENAI_BUCKET = re.compile(r'"start_time"\s*:')
_RESULTS = re.compile(r'"results"\s*:')
_COST_AMOUNT = re.compile(r'"amount"\s*:\s*"')


@dataclass(frozen=True, slots=True)
class Export:
    """One aggregated report file: what it is and how it was read."""

    index: int
    path: Path
    kind: ExportKind
    gzip: bool

    @property
    def label(self) -> str:
        return str(self.path)


def detect_export(path: Path, forced: str | None = None) -> ExportKind | None:
    """The report a file holds, ``None`` when it is not an aggregated report at all.

    ``forced`` is a ``--bill-format`` name; one of the four report names is
    trusted, any other means "not a report".
    """
    if forced is not None:
        return ExportKind(forced) if forced in EXPORT_NAMES else None
    head, _ = read_head(path)
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    if not text.startswith(("{", "[")) or not _RESULTS.search(text):
        return None
    for mark, kind in _MARKS:
        if mark.search(text):
            return kind
    if _ANTHROPIC_BUCKET.search(text):
        if _COST_AMOUNT.search(text):
            return ExportKind.ANTHROPIC_COSTS
        kind_name = "anthropic-usage or anthropic-costs"
    elif _OPENAI_BUCKET.search(text):
        kind_name = "openai-usage or openai-costs"
    else:
        return None
    # Pages whose buckets are all empty look the same for usage and costs; the name
    # --fetch --save gives its files (openai-usage.jsonl) tells them apart.
    named = next((kind for kind in ExportKind if path.name.startswith(kind.value + ".")), None)
    if named is not None and named.value in kind_name:
        return named
    raise ConfigError(
        f"{path}: its buckets hold no results, so it could be {kind_name};"
        " name it with --bill-format"
    )


_TABLES = f"""
CREATE TABLE usage (
    src INTEGER, provider VARCHAR, page BIGINT, bucket_start TIMESTAMPTZ,
    bucket_end TIMESTAMPTZ, model VARCHAR, api_key_id VARCHAR, project_id VARCHAR,
    user_id VARCHAR, service_tier VARCHAR, context_window VARCHAR, batch BOOLEAN,
    requests BIGINT, input_tokens BIGINT, cached_input_tokens BIGINT, output_tokens BIGINT);
CREATE TABLE costs (
    src INTEGER, provider VARCHAR, page BIGINT, bucket_start TIMESTAMPTZ,
    bucket_end TIMESTAMPTZ, project_id VARCHAR, line_item VARCHAR, model VARCHAR,
    amount_usd {MONEY});
CREATE TABLE export_buckets (
    src INTEGER, provider VARCHAR, usage BOOLEAN, bucket_start TIMESTAMPTZ,
    bucket_end TIMESTAMPTZ);
"""


def create_export_tables(engine: Engine) -> None:
    """Create the empty ``usage``, ``costs`` and ``export_buckets`` tables."""
    engine.execute(_TABLES)


def _pages(export: Export) -> str:
    compression = "gzip" if export.gzip else "none"
    # read_json_objects reads a document, an array of pages or one page per line.
    return (
        "SELECT row_number() OVER () AS page, json FROM read_json_objects("
        f"{sql_string(str(export.path))}, format = 'auto', compression = '{compression}',"
        f" maximum_object_size = {1 << 30})"
    )


def _bucket_times(kind: ExportKind) -> tuple[str, str]:
    if kind.provider == "openai":
        return (
            "to_timestamp(try_cast(b->>'start_time' AS BIGINT))",
            "to_timestamp(try_cast(b->>'end_time' AS BIGINT))",
        )
    return (
        "try_cast(b->>'starting_at' AS TIMESTAMPTZ)",
        "try_cast(b->>'ending_at' AS TIMESTAMPTZ)",
    )


def _count(field: str) -> str:
    return f"try_cast(r->>'{field}' AS BIGINT)"


_CREATED = "try_cast(r->'cache_creation'->>'ephemeral_{ttl}_input_tokens' AS BIGINT)"

_RESULTS_OF = {
    ExportKind.OPENAI_USAGE: f"""
        INSERT INTO usage SELECT {{src}}, 'openai', page, s, e, r->>'model', r->>'api_key_id',
            r->>'project_id', r->>'user_id', r->>'service_tier', NULL,
            try_cast(r->>'batch' AS BOOLEAN), {_count("num_model_requests")},
            {_count("input_tokens")}, coalesce({_count("input_cached_tokens")}, 0),
            {_count("output_tokens")}
        FROM results""",
    ExportKind.ANTHROPIC_USAGE: f"""
        INSERT INTO usage SELECT {{src}}, 'anthropic', page, s, e, r->>'model',
            r->>'api_key_id', r->>'workspace_id', NULL, r->>'service_tier',
            r->>'context_window', NULL, NULL,
            {_count("uncached_input_tokens")} + coalesce({_count("cache_read_input_tokens")}, 0)
                + coalesce({_CREATED.format(ttl="5m")}, 0)
                + coalesce({_CREATED.format(ttl="1h")}, 0),
            coalesce({_count("cache_read_input_tokens")}, 0), {_count("output_tokens")}
        FROM results""",
    ExportKind.OPENAI_COSTS: f"""
        INSERT INTO costs SELECT {{src}}, 'openai', page, s, e, r->>'project_id',
            r->>'line_item', nullif(split_part(r->>'line_item', ', ', 1), ''),
            try_cast(r->'amount'->>'value' AS {MONEY})
        FROM results""",
    ExportKind.ANTHROPIC_COSTS: f"""
        INSERT INTO costs SELECT {{src}}, 'anthropic', page, s, e, r->>'workspace_id',
            r->>'description', r->>'model', try_cast(r->>'amount' AS {MONEY}) / 100
        FROM results""",
}

# A result is malformed when a figure the comparison needs is missing or not a number.
_BAD_RESULT = {
    ExportKind.OPENAI_USAGE: (
        "input_tokens",
        "output_tokens",
        "num_model_requests",
    ),
    ExportKind.ANTHROPIC_USAGE: ("uncached_input_tokens", "output_tokens"),
    ExportKind.OPENAI_COSTS: (),
    ExportKind.ANTHROPIC_COSTS: (),
}


def load_export(engine: Engine, export: Export) -> tuple[int, int, str]:
    """Append one report file to its table: (results kept, malformed, a note)."""
    kind, src = export.kind, export.index
    start, end = _bucket_times(kind)
    table = "usage" if kind.is_usage else "costs"
    with engine.ordered():
        engine.execute(f"CREATE TEMP TABLE pages AS {_pages(export)}", source=export.label)
    engine.execute(
        "CREATE TEMP TABLE buckets AS SELECT page, b, "
        f"{start} AS s, {end} AS e FROM (SELECT page,"
        " unnest(CASE WHEN json_type(json, '$.data') = 'ARRAY'"
        " THEN json_extract(json, '$.data[*]') ELSE [] END) AS b FROM pages)",
        source=export.label,
    )
    engine.execute(
        "INSERT INTO export_buckets SELECT DISTINCT "
        f"{src}, '{kind.provider}', {str(kind.is_usage).lower()}, s, e"
        " FROM buckets WHERE s IS NOT NULL AND e IS NOT NULL AND e > s"
    )
    checks = [
        "WHEN s IS NULL OR e IS NULL OR e <= s THEN 'bucket without a valid start and end'",
        "WHEN json_type(r) <> 'OBJECT' THEN 'result is not an object'",
    ]
    checks += [
        f"WHEN try_cast(r->>'{name}' AS BIGINT) IS NULL THEN '{name}: missing or not an integer'"
        for name in _BAD_RESULT[kind]
    ]
    if kind is ExportKind.OPENAI_COSTS:
        checks.append(
            f"WHEN try_cast(r->'amount'->>'value' AS {MONEY}) IS NULL THEN 'amount.value: missing'"
        )
    if kind is ExportKind.ANTHROPIC_COSTS:
        checks.append(f"WHEN try_cast(r->>'amount' AS {MONEY}) IS NULL THEN 'amount: missing'")
    engine.execute(
        "CREATE TEMP TABLE all_results AS SELECT page, s, e, r, CASE "
        + " ".join(checks)
        + " END AS reason FROM (SELECT page, s, e, unnest(CASE WHEN json_type(b, '$.results')"
        " = 'ARRAY' THEN json_extract(b, '$.results[*]') ELSE [] END) AS r FROM buckets)",
        source=export.label,
    )
    engine.execute(
        f"INSERT INTO malformed SELECT {src}, page, 'page ' || page || ': ' || reason"
        " FROM all_results WHERE reason IS NOT NULL"
    )
    # Exact repeats (a page saved twice, overlapping exports) count once.
    engine.execute(
        "CREATE TEMP TABLE results AS SELECT DISTINCT ON (s, e, r::VARCHAR) page, s, e, r"
        " FROM all_results WHERE reason IS NULL ORDER BY page"
    )
    repeated = int(
        engine.scalar(
            "SELECT (SELECT count(*) FROM all_results WHERE reason IS NULL)"
            " - (SELECT count(*) FROM results)"
        )
        or 0
    )
    engine.execute(_RESULTS_OF[kind].format(src=src), source=export.label)
    notes = []
    if repeated:
        notes.append(f"{repeated} results repeated exactly in several pages, counted once")
    if kind is ExportKind.OPENAI_USAGE:
        batch = int(engine.scalar(f"SELECT count(*) FROM usage WHERE src = {src} AND batch") or 0)
        if batch:
            engine.execute(f"DELETE FROM usage WHERE src = {src} AND batch")
            notes.append(f"{batch} Batch API results left out (not sent through a gateway)")
    last = engine.rows(
        "SELECT json->>'has_more', json->>'next_page' FROM pages ORDER BY page DESC LIMIT 1"
    )
    if last and last[0][0] == "true":
        notes.append(
            f"its last page says has_more (next_page {last[0][1]}): later buckets are"
            " missing unless another file holds them"
        )
    if not engine.scalar("SELECT count(*) FROM pages WHERE json_type(json, '$.data') = 'ARRAY'"):
        raise ConfigError(f"{export.label}: no report pages in it (objects with a data array)")
    kept = int(engine.scalar(f"SELECT count(*) FROM {table} WHERE src = {src}") or 0)
    bad = int(engine.scalar(f"SELECT count(*) FROM malformed WHERE src = {src}") or 0)
    engine.execute(
        "DROP TABLE pages; DROP TABLE buckets; DROP TABLE all_results; DROP TABLE results"
    )
    return kept, bad, "; ".join(notes)
