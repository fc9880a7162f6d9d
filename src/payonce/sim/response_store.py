"""Stored Responses API responses, for ``GET /v1/responses/{id}``: bounded, oldest evicted.

OpenAI stores a response unless the request says ``"store": false``, and always
keeps a background one for polling. So does the simulator, in memory, at most
``--stored-responses`` of them (default :data:`DEFAULT_STORED_RESPONSES`): storing a
new one past the cap evicts the oldest, finished or not, and a read of an evicted
id is a 404 as for one never stored. A generation whose record was evicted still
runs to its end and is billed; only its record is gone. Each record is the encoded
object in its latest state (``queued``, ``in_progress``, then ``completed``,
``incomplete`` or ``failed``), and a few kilobytes at most.

A response belongs to the project of the credential that created it (the ledger's
``project_id``); another project reading it gets the same 404 as for a missing one,
as OpenAI scopes stored responses to their project.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DEFAULT_STORED_RESPONSES", "StoredResponses"]

DEFAULT_STORED_RESPONSES = 1000


class StoredResponses:
    """Response id -> (project id, encoded object), the newest ``capacity`` of them."""

    def __init__(self, capacity: int = DEFAULT_STORED_RESPONSES) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, not {capacity}")
        self.capacity = capacity
        self._records: OrderedDict[str, tuple[str, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, response_id: str, project_id: str, body: bytes) -> None:
        """Store a new response, evicting the oldest ones past the capacity."""
        if self.capacity == 0:
            return
        self._records[response_id] = (project_id, body)
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)

    def update(self, response_id: str, body: bytes) -> None:
        """Replace a stored response's object, keeping its place; nothing if it was evicted."""
        record = self._records.get(response_id)
        if record is not None:
            self._records[response_id] = (record[0], body)

    def get(self, response_id: str, project_id: str) -> bytes | None:
        """The stored object, if there is one and ``project_id`` owns it."""
        record = self._records.get(response_id)
        if record is None or record[0] != project_id:
            return None
        return record[1]
