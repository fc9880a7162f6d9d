"""The billing ledger: what the simulated provider would invoice.

A provider bills a generation when it finishes, whether or not the client is still
there to receive it (docs/sim.md, billing ledger). So does this ledger: the request handler
calls :meth:`Ledger.bill` right after the simulated generation, before it tries to
answer (a stream: after its last token, before its terminating event), and records
whether the client was still connected at that moment.

Comparing ``billed`` with the number of business calls a client made is the whole
point: every entry beyond one per call is a duplicate the client paid for.

The ledger sits on the request path of throughput benchmarks, so billing is an
append to a list and, with a CSV export, one buffered ``write``; the export is
flushed once a second, when the ledger is read over HTTP, and on shutdown.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from payonce.errors import ConfigError

__all__ = [
    "CSV_FIELDS",
    "CsvExport",
    "Ledger",
    "LedgerEntry",
    "credential_ids",
    "credential_of",
    "format_timestamp",
]

CSV_FIELDS = (
    "provider_request_id",
    "model",
    "endpoint",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "finished_at",
    "client_connected",
    "user",
    "api_key_id",
    "project_id",
)


def format_timestamp(seconds: float) -> str:
    """Epoch seconds as ISO 8601 UTC with milliseconds: ``2023-11-14T22:13:20.000Z``."""
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def credential_of(headers: Mapping[str, str]) -> str:
    """A request's API key: ``x-api-key`` (Anthropic), else the ``Authorization`` bearer.

    ``headers`` must be case-insensitive. Only its hash reaches the ledger
    (:func:`credential_ids`).
    """
    key = headers.get("x-api-key")
    if key is not None:
        return key
    authorization = headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else authorization


def credential_ids(credential: str, *, anthropic: bool) -> tuple[str, str]:
    """The simulated API key id and project (OpenAI) or workspace (Anthropic) of a credential.

    Both come from the SHA-256 of the credential, never the credential itself:
    ``key_<12 hex>`` and ``proj_<next 12 hex>`` for OpenAI endpoints,
    ``apikey_<12 hex>`` and ``wrkspc_<next 12 hex>`` for Anthropic's. The same
    credential always gets the same ids, so the admin usage endpoints can group
    and filter by them; a request without a credential hashes the empty string.
    """
    digest = hashlib.sha256(credential.encode("utf-8", "surrogateescape")).hexdigest()
    if anthropic:
        return f"apikey_{digest[:12]}", f"wrkspc_{digest[12:24]}"
    return f"key_{digest[:12]}", f"proj_{digest[12:24]}"


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One billed generation, as a provider's billing export would list it.

    ``finished_at`` is epoch seconds; JSON and CSV show it as ISO 8601 UTC. Formatting
    waits until then so that billing, on the request path, stays an append.
    """

    provider_request_id: str
    model: str
    endpoint: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    finished_at: float
    client_connected: bool
    user: str = ""  # the end user the request named (OpenAI "user"), "" when none
    # From the request's credential (:func:`credential_ids`); "" for entries built by hand.
    api_key_id: str = ""
    project_id: str = ""  # OpenAI project, or Anthropic workspace for /v1/messages

    def as_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready values, keys in :data:`CSV_FIELDS` order."""
        return {
            "provider_request_id": self.provider_request_id,
            "model": self.model,
            "endpoint": self.endpoint,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "finished_at": format_timestamp(self.finished_at),
            "client_connected": self.client_connected,
            "user": self.user,
            "api_key_id": self.api_key_id,
            "project_id": self.project_id,
        }


class CsvExport:
    """Appends ledger entries to a CSV file, a header row first when the file is new.

    The export is append-only, like a provider's billing history: resetting the
    in-memory ledger does not erase it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file: TextIO = path.open("a", newline="", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--ledger: cannot open {str(path)!r}: {exc.strerror}") from exc
        self._writer = csv.writer(self._file)
        self._dirty = False
        if self._file.tell() == 0:
            self._writer.writerow(CSV_FIELDS)
            self._dirty = True

    def write(self, entry: LedgerEntry) -> None:
        """Buffer one row (no flush: see :meth:`flush`)."""
        self._writer.writerow(
            (
                entry.provider_request_id,
                entry.model,
                entry.endpoint,
                entry.input_tokens,
                entry.output_tokens,
                entry.cost_usd,
                format_timestamp(entry.finished_at),
                "true" if entry.client_connected else "false",
                entry.user,
                entry.api_key_id,
                entry.project_id,
            )
        )
        self._dirty = True

    def flush(self) -> None:
        """Push buffered rows to the operating system, if there are any."""
        if self._dirty:
            self._file.flush()
            self._dirty = False

    def close(self) -> None:
        """Flush and close the file."""
        if not self._file.closed:
            self.flush()
            self._file.close()


class Ledger:
    """Billed generations and the count of requests received, since start or last reset."""

    def __init__(self, export: CsvExport | None = None) -> None:
        self.export = export
        self.requests = 0
        self.cost_usd = 0.0
        self.entries: list[LedgerEntry] = []
        # Generations started and not finished yet: each will be billed when it
        # finishes (unless its stream dies), whether or not anyone still waits.
        self.generating = 0

    def count_request(self) -> None:
        """Note one request received on a generation endpoint, whatever its outcome."""
        self.requests += 1

    def bill(self, entry: LedgerEntry) -> None:
        """Record a finished generation (and buffer it to the export)."""
        self.entries.append(entry)
        self.cost_usd += entry.cost_usd
        if self.export is not None:
            self.export.write(entry)

    def reset(self) -> None:
        """Forget everything in memory; the CSV export keeps its rows."""
        self.requests = 0
        self.cost_usd = 0.0
        self.entries = []

    @property
    def billed(self) -> int:
        """How many generations were billed."""
        return len(self.entries)

    def summary(self, *, with_entries: bool = True) -> dict[str, Any]:
        """The ledger as ``GET /_sim/ledger`` answers (billed, cost, requests, generating)."""
        return {
            "billed": self.billed,
            "cost_usd": round(self.cost_usd, 12),
            "requests": self.requests,
            "generating": self.generating,
            "entries": [entry.as_dict() for entry in self.entries] if with_entries else [],
        }
