"""Load input files into three DuckDB tables: ``calls``, ``bill`` and ``malformed``.

Each file is read by DuckDB's own readers, so nothing has to fit in memory (once;
the usage reconciliation reads a call log twice, :func:`scan_source` then
:func:`load_source`):

- **CSV** goes through ``read_csv`` with every column typed (money as
  ``DECIMAL(18,10)``, counts as ``BIGINT``, timestamps as ``TIMESTAMPTZ``). A row
  DuckDB cannot parse or convert is kept out of the table and written to a
  rejects table with its physical line number; those rows become ``malformed``.
- **JSON lines** are read as raw text lines (``read_csv`` with a delimiter that a
  JSON text never contains unescaped), numbered in file order, and parsed with
  one ``json_extract_string`` per line. A line that is not a JSON object, or whose
  values have the wrong type, is malformed with that line number.
- **A JSON document** (an array of records, or ``{"data": [...]}``) is read with
  ``read_json``; its records are numbered from 1 ("record N" rather than a line).

Blank lines are skipped. Money is exact: ``DECIMAL(18,10)`` sums without the
drift of binary floats, so a report says 0.3, not 0.30000000000000004.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from payonce.errors import ConfigError
from payonce.reconcile.engine import Engine, sql_string
from payonce.reconcile.prices import MONEY, price_bill_lines
from payonce.reconcile.schema import FieldKind, Side, SourceFormat, fields_of
from payonce.reconcile.sniff import STAMP, Container, Sniffed

__all__ = [
    "LoadedSource",
    "Source",
    "Target",
    "create_tables",
    "load_source",
    "resolve_columns",
    "scan_source",
]

_MAX_LINE = 64 << 20
# Statuses written as words (LiteLLM writes "success"/"failure").
_SUCCESS_WORDS = "('success', 'succeeded', 'ok', 'completed', 'true')"

_TABLES = f"""
-- Model, endpoint and tag also travel as 64-bit hashes (m, e, t), computed once
-- here: the big aggregations group and compare integers, not strings. Business and
-- request ids travel as their 128-bit MD5 (kb, kp): at a hundred million rows the
-- joins and groupings keyed by the strings spilled tens of GiB.
CREATE MACRO h(x) AS nullif(hash(x), hash(NULL::VARCHAR));
CREATE TABLE calls (
    src INTEGER, pos BIGINT, business_id VARCHAR, kb UHUGEINT, kp UHUGEINT,
    model VARCHAR, endpoint VARCHAR, tag VARCHAR, m UBIGINT, e UBIGINT, t UBIGINT,
    success BOOLEAN, unkeyed_retry BOOLEAN, ts TIMESTAMPTZ, reason VARCHAR,
    outcome VARCHAR, upstream_status BIGINT, upstream_attempts BIGINT,
    upstream_cancelled BOOLEAN, input_tokens BIGINT, output_tokens BIGINT,
    cost_usd {MONEY}, price_source VARCHAR, list_cost_usd {MONEY});
-- No figure uses the token counts, but reading them checks them (a row with a bad
-- one is malformed) and makes DuckDB check every row's column count.
CREATE TABLE bill (
    src INTEGER, pos BIGINT, provider_request_id VARCHAR, kp UHUGEINT, cost_usd {MONEY},
    model VARCHAR, endpoint VARCHAR, m UBIGINT, e UBIGINT, input_tokens BIGINT,
    output_tokens BIGINT, ts TIMESTAMPTZ, reason VARCHAR, part BIGINT);
CREATE TABLE malformed (src INTEGER, line BIGINT, reason VARCHAR);
"""

_CSV_TYPES = {
    FieldKind.TEXT: "VARCHAR",
    FieldKind.STATUS: "VARCHAR",
    FieldKind.MONEY: MONEY,
    FieldKind.COUNT: "BIGINT",
    FieldKind.TIMESTAMP: "TIMESTAMPTZ",
    FieldKind.AMOUNT: MONEY,
    FieldKind.FLAG: "BOOLEAN",
}


@dataclass(frozen=True, slots=True)
class Source:
    """One input file, sniffed, with its format and the columns it will be read from.

    ``columns`` maps each normalized field the file provides to its column (a
    field whose optional column is absent is simply not there).
    """

    index: int
    sniffed: Sniffed
    side: Side
    format: SourceFormat
    columns: Mapping[str, str]

    @property
    def label(self) -> str:
        return str(self.sniffed.path)

    @property
    def priced(self) -> bool:
        """Costs come from the price table (no cost column was named)."""
        return self.format.priced and "cost_usd" not in self.columns


@dataclass(frozen=True, slots=True)
class LoadedSource:
    """A source after loading: rows kept and rows reported as malformed."""

    source: Source
    rows: int
    malformed: int
    note: str = ""


def _present(column: str, sniffed: Sniffed) -> bool:
    if column in sniffed.columns:
        return True
    # JSON sources accept a dotted path into a nested object (metadata.team).
    head = column.split(".", 1)[0]
    return sniffed.container is not Container.CSV and "." in column and head in sniffed.columns


def resolve_columns(
    index: int,
    sniffed: Sniffed,
    side: Side,
    fmt: SourceFormat,
    fields: frozenset[str] | None = None,
) -> Source:
    """Match a format to a file's columns; a missing required column is an error (exit 2).

    ``fields`` limits the optional fields read (each one read costs time on every
    line); a required field, or one named in a map, is always read.
    """
    columns: dict[str, str] = {}
    for name, column in fmt.columns.items():
        if fields is not None and name not in fields and name not in fmt.required:
            continue
        if _present(column, sniffed):
            columns[name] = column
        elif name in fmt.required:
            flag = f"--{side.value}-map"
            found = ", ".join(sniffed.columns[:12]) or "none"
            raise ConfigError(
                f"{sniffed.path}: missing column {column!r} ({fmt.name} {side.value} format,"
                f" field {name}; name another with {flag} {name}=COLUMN; columns found: {found})"
            )
    return Source(index, sniffed, side, fmt, columns)


def create_tables(engine: Engine) -> None:
    """Create the empty ``calls``, ``bill`` and ``malformed`` tables."""
    engine.execute(_TABLES)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a file's normalized rows go instead of ``calls``/``bill``.

    ``insert`` turns the SELECT of the file's normalized rows into the SELECT of
    what to append to ``table`` (the usage reconciliation counts calls into cells
    as it reads them); what it appends keeps ``src``, ``pos`` and ``reason``, and
    ``rows`` is the aggregate that counts the file's rows in it.
    """

    table: str
    insert: Callable[[str], str]
    rows: str = "count(*)"


def scan_source(engine: Engine, source: Source, statement: Callable[[str], str]) -> bool:
    """Run ``statement`` over one file's normalized rows, without keeping its bad rows.

    For a first pass over a file that :func:`load_source` reads again: returns
    whether the file had to be read leniently, so the second read does the same
    (and sees the same rows).
    """
    if source.sniffed.container is not Container.CSV:
        engine.execute(statement(_json_select(source)), source=source.label)
        return False
    rejects = f"rejects_{source.index}_scan"
    strict = _read_csv(engine, source, rejects, statement, strict=True)
    engine.execute(f"DROP TABLE {rejects}_errors; DROP TABLE {rejects}_scans")
    return not strict


def _read_csv(
    engine: Engine, source: Source, rejects: str, statement: Callable[[str], str], *, strict: bool
) -> bool:
    """Run ``statement`` over a CSV file's rows; False when it had to read leniently."""
    try:
        engine.execute(statement(_csv_select(source, rejects, strict=strict)), source=source.label)
        return strict
    except ConfigError as exc:
        if not strict or "state machine" not in str(exc):
            raise
    # Mixed line endings or a stray quote stop DuckDB's strict parser for the whole
    # file. Read it leniently instead (the caller says what that costs).
    engine.execute(f"DROP TABLE IF EXISTS {rejects}_errors; DROP TABLE IF EXISTS {rejects}_scans")
    engine.execute(statement(_csv_select(source, rejects, strict=False)), source=source.label)
    return False


def load_source(
    engine: Engine, source: Source, into: Target | None = None, *, lenient: bool = False
) -> LoadedSource:
    """Append one file to ``calls`` or ``bill``; its bad rows go to ``malformed``.

    ``into`` puts the file's normalized rows somewhere else (see :class:`Target`).
    ``lenient`` reads a CSV file leniently from the start (a first pass found
    that the strict parser cannot read it).
    """
    table = "calls" if source.side is Side.CALLS else "bill"
    count = "count(*)"
    wrap: Callable[[str], str] = lambda select: select  # noqa: E731
    if into is not None:
        table, wrap, count = into.table, into.insert, into.rows
    note = ""

    def insert(select: str) -> str:
        return f"INSERT INTO {table} BY NAME {wrap(select)}"

    if source.sniffed.container is Container.CSV:
        rejects = f"rejects_{source.index}"
        if not _read_csv(engine, source, rejects, insert, strict=not lenient):
            note = (
                "read leniently (mixed line endings or stray quotes): a row with too"
                " many columns keeps the first ones instead of being reported"
            )
        engine.execute(
            f"INSERT INTO malformed SELECT {source.index}, line, {_REJECT_REASON}"
            f" FROM {rejects}_errors ORDER BY line",
            source=source.label,
        )
        engine.execute(f"DROP TABLE {rejects}_errors; DROP TABLE {rejects}_scans")
        note = _join_parts(engine, source, note)
        if source.priced:
            price_bill_lines(engine, source.index)
            # DuckDB does not number the rows it keeps: line 0 means "not known".
            engine.execute(
                "INSERT INTO malformed SELECT src, coalesce(pos, 0), reason FROM bill"
                f" WHERE src = {source.index} AND reason IS NOT NULL"
            )
            engine.execute(f"DELETE FROM bill WHERE src = {source.index} AND reason IS NOT NULL")
    else:
        with engine.ordered():
            engine.execute(insert(_json_select(source)), source=source.label)
        note = _join_parts(engine, source, note)
        if source.priced:
            price_bill_lines(engine, source.index)
        engine.execute(
            f"INSERT INTO malformed SELECT src, pos, reason FROM {table}"
            f" WHERE src = {source.index} AND reason IS NOT NULL ORDER BY pos"
        )
        engine.execute(f"DELETE FROM {table} WHERE src = {source.index} AND reason IS NOT NULL")
    rows = engine.scalar(f"SELECT {count} FROM {table} WHERE src = {source.index}")
    bad = engine.scalar(f"SELECT count(*) FROM malformed WHERE src = {source.index}")
    return LoadedSource(source, int(rows or 0), int(bad or 0), note)


# ---------------------------------------------------------------- CSV


_REJECT_REASON = """CASE error_type
    WHEN 'CAST' THEN 'column "' || column_name || '": ' || coalesce(nullif(
        regexp_replace(error_message, '^Error when converting column "[^"]*"\\.\\s*', ''),
        ''), 'empty')
    WHEN 'MISSING COLUMNS' THEN 'too few columns (' || error_message || ')'
    WHEN 'TOO MANY COLUMNS' THEN 'too many columns (' || error_message || ')'
    ELSE lower(error_type) || ': ' || error_message END"""


def _csv_select(source: Source, rejects: str, *, strict: bool) -> str:
    sniffed = source.sniffed
    fields = fields_of(source.side)
    kind_of_column: dict[str, FieldKind] = {}
    for name, column in source.columns.items():
        kind_of_column.setdefault(column, fields[name])
    types = ", ".join(
        f"{sql_string(column)}: '{_CSV_TYPES[kind_of_column.get(column, FieldKind.TEXT)]}'"
        for column in _unique_names(sniffed.columns)
    )
    # Money columns keep '' instead of NULL, so an empty amount fails to convert
    # and is rejected with its line number instead of passing as "no cost".
    money = [c for n, c in source.columns.items() if fields[n] is FieldKind.MONEY]
    money_list = ", ".join(sql_string(column) for column in money)
    keep_empty = f" force_not_null = [{money_list}]," if money else ""
    reader = (
        f"read_csv({sql_string(str(sniffed.path))}, header = true, auto_detect = false,"
        f" delim = {sql_string(sniffed.delimiter)}, quote = '\"', escape = '\"',"
        f" columns = {{{types}}}, store_rejects = true,"
        f" rejects_table = '{rejects}_errors', rejects_scan = '{rejects}_scans',"
        f"{keep_empty}"
        f" compression = '{'gzip' if sniffed.gzip else 'none'}',"
        f" strict_mode = {str(strict).lower()})"
    )
    values = {name: _quoted(column) for name, column in source.columns.items()}
    scope, flag = source.format.business_scope, source.format.unkeyed_retry_flag
    part = source.format.part_column or ""
    return _normalize(
        source,
        values,
        # CSV rows need no number (DuckDB numbers the rejected lines itself), and
        # numbering them would serialize the scan.
        f"SELECT NULL::BIGINT AS __pos, * FROM {reader}",
        scope=_quoted(scope) if scope and scope in sniffed.columns else None,
        retry_flag=_quoted(flag) if flag and flag in sniffed.columns else None,
        part=f"try_cast({_quoted(part)} AS BIGINT)" if part in sniffed.columns else None,
    )


def _unique_names(columns: tuple[str, ...]) -> list[str]:
    # DuckDB needs distinct names; a repeated header is read under a suffixed name.
    seen: dict[str, int] = {}
    names = []
    for column in columns:
        count = seen.get(column, 0)
        seen[column] = count + 1
        names.append(column if count == 0 else f"{column}_{count}")
    return names


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


# ---------------------------------------------------------------- JSON


def _json_path(column: str, sniffed: Sniffed) -> str:
    parts = [column] if column in sniffed.columns else column.split(".")
    return "$" + "".join("." + '"' + part.replace('"', '\\"') + '"' for part in parts)


def _json_reader(sniffed: Sniffed) -> str:
    path = sql_string(str(sniffed.path))
    compression = "gzip" if sniffed.gzip else "none"
    if sniffed.container is Container.JSONL:
        # \x01 never appears unescaped in JSON text, so each line is one value.
        reader = (
            f"read_csv({path}, columns = {{'j': 'VARCHAR'}}, header = false,"
            f" auto_detect = false, delim = '\x01', quote = '', escape = '',"
            f" strict_mode = false, compression = '{compression}', max_line_size = {_MAX_LINE})"
        )
        return f"SELECT row_number() OVER () AS __pos, j FROM {reader}"
    reader = (
        f"read_json({path}, format = 'auto', records = false, columns = {{'json': 'JSON'}},"
        f" compression = '{compression}', maximum_object_size = {1 << 30})"
    )
    return (
        "SELECT row_number() OVER () AS __pos, j FROM (SELECT unnest(CASE"
        " WHEN json_type(json) = 'ARRAY' THEN json_extract(json, '$[*]')"
        " WHEN json_type(json) = 'OBJECT' AND json_type(json, '$.data') = 'ARRAY'"
        " THEN json_extract(json, '$.data[*]') ELSE [json] END)::VARCHAR AS j"
        f" FROM {reader})"
    )


def _json_select(source: Source) -> str:
    sniffed = source.sniffed
    wanted = dict(source.columns)
    extras = [c for c in (source.format.business_scope, source.format.unkeyed_retry_flag) if c]
    paths = [*wanted.values(), *(c for c in extras if _present(c, sniffed))]
    slot = {column: index + 1 for index, column in enumerate(dict.fromkeys(paths))}
    unbilled = source.format.unbilled_flag
    part = source.format.part_column
    for extra in (unbilled, part):
        if extra and _present(extra, sniffed):
            slot.setdefault(extra, len(slot) + 1)
    path_list = ", ".join(sql_string(_json_path(column, sniffed)) for column in slot)
    reader = _json_reader(sniffed)
    if sniffed.stamped:
        # "<timestamp> {...}": the record starts at the first brace.
        reader = (
            f"SELECT __pos, CASE WHEN regexp_matches(left(j, 64), {sql_string(STAMP)})"
            " THEN substr(j, strpos(j, '{')) ELSE j END AS j FROM (" + reader + ")"
        )
    if sniffed.enveloped:
        # One API response per record: the record is its "data" object.
        reader = (
            "SELECT __pos, coalesce(CASE WHEN starts_with(ltrim(left(j, 64)), '{') THEN"
            " try(json_extract(j, '$.data'))::VARCHAR END, j) AS j FROM (" + reader + ")"
        )
    parsed = (
        # Only the head of a line is looked at (trimming a whole long line copies it);
        # blank lines are skipped, and DuckDB reads an empty line as NULL.
        "SELECT __pos, CASE WHEN starts_with(ltrim(left(j, 64)), '{') THEN"
        f" try(json_extract_string(j, [{path_list}])) END AS v"
        f" FROM ({reader})"
        " WHERE j IS NOT NULL AND (length(j) > 64 OR trim(j) <> '')"
    )
    cost_column = source.columns.get("cost_usd")
    if unbilled and unbilled in slot and cost_column:
        # A cancelled generation that cost nothing was never billed: no bill line.
        parsed = (
            f"SELECT * FROM ({parsed}) WHERE NOT coalesce(try_cast(v[{slot[unbilled]}] AS BOOLEAN)"
            f" AND try_cast(v[{slot[cost_column]}] AS {MONEY}) = 0, false)"
        )
    values = {name: f"v[{slot[column]}]" for name, column in wanted.items()}
    fields = fields_of(source.side)
    checks = ["WHEN v IS NULL THEN 'not a JSON object'"]
    for name, raw in values.items():
        kind = fields[name]
        column = source.columns[name]
        if kind is FieldKind.MONEY:
            checks.append(f"WHEN {raw} IS NULL THEN '{column}: missing'")
        typed = _typed(raw, kind)
        if kind in _NOUN:
            checks.append(
                f"WHEN {raw} IS NOT NULL AND {typed} IS NULL THEN"
                f" '{column}: not {_NOUN[kind]}: ' || {raw}"
            )
        values[name] = typed
    scope = source.format.business_scope
    flag = source.format.unkeyed_retry_flag
    reason = "CASE " + " ".join(checks) + " END"
    return _normalize(
        source,
        values,
        parsed,
        reason=reason,
        scope=f"v[{slot[scope]}]" if scope in slot else None,
        retry_flag=f"v[{slot[flag]}]" if flag in slot else None,
        part=f"try_cast(v[{slot[part]}] AS BIGINT)" if part and part in slot else None,
    )


_NOUN = {
    FieldKind.MONEY: "a number",
    FieldKind.AMOUNT: "a number",
    FieldKind.FLAG: "true or false",
    FieldKind.COUNT: "an integer",
    FieldKind.TIMESTAMP: "a timestamp",
}


def _typed(raw: str, kind: FieldKind) -> str:
    if kind in (FieldKind.MONEY, FieldKind.AMOUNT):
        return f"try_cast({raw} AS {MONEY})"
    if kind is FieldKind.FLAG:
        return f"try_cast({raw} AS BOOLEAN)"
    if kind is FieldKind.COUNT:
        return f"try_cast({raw} AS BIGINT)"
    if kind is FieldKind.TIMESTAMP:
        return f"try_cast({raw} AS TIMESTAMPTZ)"
    return raw


# ---------------------------------------------------------------- both


def _normalize(
    source: Source,
    values: Mapping[str, str],
    relation: str,
    *,
    reason: str = "NULL",
    scope: str | None = None,
    retry_flag: str | None = None,
    part: str | None = None,
) -> str:
    """SELECT the normalized columns of one side from ``relation`` (which has ``__pos``).

    ``values`` holds an SQL expression per field the source provides; ``scope``
    and ``retry_flag`` are the expressions of the format's business scope and
    unkeyed-retry columns, when the file has them.
    """

    def text(name: str) -> str:
        value = values.get(name)
        return f"nullif({value}, '')" if value else "NULL"

    def plain(name: str) -> str:
        return values.get(name) or "NULL"

    # The gateway's own paths (an answer fetched from /_payonce/requests/{key}/response
    # after a timed-out attempt) name no provider endpoint: the business request's
    # endpoint comes from its other calls.
    endpoint = (
        f"CASE WHEN NOT starts_with({text('endpoint')}, '/_payonce/') THEN {text('endpoint')} END"
    )
    columns = [f"{source.index} AS src", "__pos AS pos", f"{reason} AS reason"]
    columns += [f"{text(name)} AS {name}" for name in ("provider_request_id", "model")]
    columns.append(f"{endpoint} AS endpoint")
    columns.append(f"{plain('ts')} AS ts")
    columns += [f"h({text('model')}) AS m", f"h({endpoint}) AS e"]
    if source.side is Side.BILL:
        columns += [
            f"{plain(name)} AS {name}" for name in ("cost_usd", "input_tokens", "output_tokens")
        ]
        columns.append(f"{part or 'NULL'} AS part")
        return _hashed(f"SELECT {', '.join(columns)} FROM ({relation})", "kp")
    key = text("business_id")
    if scope:
        key = f"CASE WHEN {key} IS NOT NULL THEN coalesce({scope} || ':', '') || {key} END"
    retry = (
        f"({key} IS NULL AND coalesce(try_cast({retry_flag} AS BOOLEAN), false))"
        if retry_flag
        else "false"
    )
    status = values.get("status")
    # 2xx, or a word such as "success"; a call without a status counts as successful.
    success = (
        f"coalesce(try_cast({status} AS INTEGER) BETWEEN 200 AND 299,"
        f" lower({status}) IN {_SUCCESS_WORDS}, true)"
        if status
        else "true"
    )
    # A call without a business id is its own business request, unless it is a
    # retry known to have been sent without one (then it duplicates another call).
    business = (
        f"coalesce({key}, CASE WHEN NOT {retry} THEN '#{source.index}:'"
        " || coalesce(__pos::VARCHAR, gen_random_uuid()::VARCHAR) END)"
    )
    columns += [
        f"{business} AS business_id",
        f"{text('tag')} AS tag",
        f"h({text('tag')}) AS t",
        f"{success} AS success",
        f"{retry} AS unkeyed_retry",
    ]
    columns += [f"{plain(name)} AS {name}" for name in _UPSTREAM_FIELDS]
    columns.append(f"{text('price_source')} AS price_source")
    # A call's request id is only ever joined on, so only its hash is kept.
    return _hashed(f"SELECT {', '.join(columns)} FROM ({relation})", "kp", "kb", drop="kp")


def _hashed(select: str, *keys: str, drop: str | None = None) -> str:
    # Hashed from the columns, not from their expressions: a line without a business
    # id gets a random one, which must be the same value in business_id and kb. A
    # reader that uses neither (the usage reconciliation) computes neither. ``drop``
    # leaves out the id whose hash is that key.
    ids = {"kp": "provider_request_id", "kb": "business_id"}
    hashes = ", ".join(f"md5_number({ids[key]}) AS {key}" for key in keys)
    kept = f"* EXCLUDE ({ids[drop]})" if drop else "*"
    return f"SELECT {kept}, {hashes} FROM ({select})"


_UPSTREAM_FIELDS = (
    "outcome",
    "upstream_status",
    "upstream_attempts",
    "upstream_cancelled",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "list_cost_usd",
)


# ---------------------------------------------------------------- split rows


def _join_parts(engine: Engine, source: Source, note: str) -> str:
    """Keep one row per request id of a log whose entries are split in numbered parts."""
    column = source.format.part_column
    if source.side is not Side.BILL or not column or column not in source.sniffed.columns:
        return note
    src = source.index
    before = int(engine.scalar(f"SELECT count(*) FROM bill WHERE src = {src}") or 0)
    engine.execute(
        f"DELETE FROM bill WHERE src = {src} AND reason IS NULL AND part IS NOT NULL"
        " AND provider_request_id IS NOT NULL AND part > (SELECT min(first.part) FROM bill"
        f" first WHERE first.src = {src} AND first.reason IS NULL"
        " AND first.provider_request_id = bill.provider_request_id)"
    )
    dropped = before - int(engine.scalar(f"SELECT count(*) FROM bill WHERE src = {src}") or 0)
    if not dropped:
        return note
    joined = f"{dropped} continuation rows ({column} after a request's first) left out"
    return f"{note}; {joined}" if note else joined
