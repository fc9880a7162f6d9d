"""A look at the first lines of an input file: container, compression, columns, format.

Only the head of a file is read here (gzip is recognised by its magic bytes, not
by the name); DuckDB reads the whole file later. What a file *is* comes from
its content: a ``{`` line is JSON lines, a ``[`` is a JSON document, anything
else is a CSV header. The format (payonce, ledger, LiteLLM, generic) is the
first whose signature columns are all present.
"""

from __future__ import annotations

import csv
import enum
import gzip
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

from payonce.errors import ConfigError
from payonce.reconcile.schema import Side, SourceFormat, format_named, formats_for

__all__ = ["Container", "Sniffed", "detect_format", "read_head", "sniff"]

_SAMPLE_BYTES = 1 << 20  # enough for a header and a few hundred JSON lines
_SAMPLE_LINES = 200
_DELIMITERS = (",", "\t", ";", "|")


class Container(enum.Enum):
    """How records are laid out in the file."""

    CSV = "csv"
    JSONL = "jsonl"
    JSON = "json"  # one document: an array of records, or {"data": [...]}


@dataclass(frozen=True, slots=True)
class Sniffed:
    """What the head of a file says about it.

    ``columns`` is the CSV header, or for JSON the keys seen in the sampled
    records (in first-seen order).
    """

    path: Path
    container: Container
    gzip: bool
    columns: tuple[str, ...]
    delimiter: str = ","
    enveloped: bool = False  # each record is {"data": {...}} (one API response per record)
    stamped: bool = False  # each line is "<ISO timestamp> {...}" (a CloudWatch Logs export)
    # JSON: the keys some sampled record gives a value (not null, not ""); CSV: none known.
    filled: frozenset[str] = frozenset()


# A CloudWatch Logs export task writes each event as its timestamp, a space, the message.
STAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[^ {]* \{"
_STAMP = re.compile(STAMP)


def read_head(path: Path) -> tuple[bytes, bool]:
    try:
        with path.open("rb") as raw:
            magic = raw.read(2)
            raw.seek(0)
            if magic == b"\x1f\x8b":
                with gzip.open(raw) as unzipped:
                    return unzipped.read(_SAMPLE_BYTES), True
            return raw.read(_SAMPLE_BYTES), False
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory") from None
    except (OSError, EOFError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc


def _lines(head: bytes) -> list[str]:
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    lines = text.splitlines()
    if len(head) == _SAMPLE_BYTES and lines:
        lines.pop()  # probably cut in the middle
    return [line for line in lines if line.strip()]


def _delimiter(header: str) -> str:
    counts = {sep: header.count(sep) for sep in _DELIMITERS}
    best = max(counts, key=lambda sep: counts[sep])
    return best if counts[best] else ","


def _json_keys(records: list[object]) -> tuple[str, ...]:
    keys: dict[str, None] = {}
    for record in records:
        if isinstance(record, dict):
            keys.update(dict.fromkeys(record))
    return tuple(keys)


def _filled(records: list[object]) -> frozenset[str]:
    keys: set[str] = set()
    for record in records:
        if isinstance(record, dict):
            keys.update(key for key, value in record.items() if value is not None and value != "")
    return frozenset(keys)


def _unwrapped(records: list[object]) -> list[object] | None:
    """The inner records when every record is an API response ``{"data": {...}}``."""
    dicts = [record for record in records if isinstance(record, dict)]
    if not dicts or not all(isinstance(record.get("data"), dict) for record in dicts):
        return None
    return [record["data"] for record in dicts]


def sniff(path: Path) -> Sniffed:
    """Read the head of ``path`` and tell its container and columns."""
    head, zipped = read_head(path)
    lines = _lines(head)
    if not lines:
        raise ConfigError(f"{path}: empty file")
    first = lines[0].lstrip()
    if _STAMP.match(first):
        stamped = [line[line.index("{") :] for line in lines[:_SAMPLE_LINES] if "{" in line]
        loaded = [_loaded(line) for line in stamped]
        keys = _json_keys(loaded)
        return Sniffed(path, Container.JSONL, zipped, keys, stamped=True, filled=_filled(loaded))
    if first.startswith("["):
        return _document(path, zipped, head)
    if first.startswith("{"):
        envelope = _loaded(first)
        if envelope is None:
            # A "{" line that is not a whole object: a pretty-printed document (or a
            # line nested past what json reads, found malformed when loaded).
            return _document(path, zipped, head)
        if isinstance(envelope, dict) and isinstance(envelope.get("data"), list):
            # {"data": [...]} on one line: an API export, not one record per line.
            return Sniffed(path, Container.JSON, zipped, _json_keys(envelope["data"]))
        # Malformed lines (None) are counted later, with their numbers.
        records = [
            record for line in lines[:_SAMPLE_LINES] if (record := _loaded(line)) is not None
        ]
        inner = _unwrapped(records)
        if inner is not None:
            return Sniffed(
                path,
                Container.JSONL,
                zipped,
                _json_keys(inner),
                enveloped=True,
                filled=_filled(inner),
            )
        return Sniffed(path, Container.JSONL, zipped, _json_keys(records), filled=_filled(records))
    delimiter = _delimiter(lines[0])
    header = next(csv.reader(io.StringIO(lines[0]), delimiter=delimiter))
    return Sniffed(path, Container.CSV, zipped, tuple(name.strip() for name in header), delimiter)


def _document(path: Path, zipped: bool, head: bytes) -> Sniffed:
    records = _json_document_records(head)
    inner = _unwrapped(records)
    if inner is not None:
        return Sniffed(
            path, Container.JSON, zipped, _json_keys(inner), enveloped=True, filled=_filled(inner)
        )
    return Sniffed(path, Container.JSON, zipped, _json_keys(records), filled=_filled(records))


def _loaded(line: str) -> object:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or nested past what json reads
        return None


def _json_document_records(head: bytes) -> list[object]:
    # The document may be larger than the sample; decode the records that fit.
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    decoder = json.JSONDecoder()
    if text.startswith("{"):
        marker = text.find("[")
        text = text[marker:] if marker >= 0 else ""
    records: list[object] = []
    position = 1
    while len(records) < _SAMPLE_LINES and position < len(text):
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        try:
            record, position = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):
            break
        records.append(record)
    return records


def detect_format(sniffed: Sniffed, side: Side, forced: str | None) -> SourceFormat:
    """The format named by ``forced``, else the first whose signature matches."""
    if forced:
        return format_named(side, forced)
    columns = set(sniffed.columns)
    candidates = formats_for(side)
    for fmt in candidates:
        if fmt.signature and fmt.signature <= columns:
            return fmt
    return candidates[-1]
