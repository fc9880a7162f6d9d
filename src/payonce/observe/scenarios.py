"""Where the money goes: the endpoint a request calls and the business scenario it names.

The endpoint comes from the request's path, one of :data:`ENDPOINTS`. The
scenario comes from a header the caller sends (``X-Payonce-Scenario``, or the
one a team already sends: ``--scenario-header Helicone-Property-Feature``). The
call log keeps the scenario exactly as sent; the metrics label it only when the
operator listed it (``--scenarios a,b,c``), else ``other`` (``none`` when no
scenario was sent), so callers cannot create series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "ENDPOINTS",
    "NO_SCENARIO",
    "OTHER_SCENARIO",
    "SCENARIO_HEADER",
    "Scenarios",
    "endpoint_of",
]

ENDPOINTS = ("chat", "responses", "messages", "completions", "embeddings", "other")
SCENARIO_HEADER = "x-payonce-scenario"
NO_SCENARIO = "none"  # the label of a request that named no scenario
OTHER_SCENARIO = "other"  # the label of a scenario the operator did not list

# Path endings, most specific first: "/chat/completions" before "/completions".
_ENDINGS = (
    ("/chat/completions", "chat"),
    ("/responses", "responses"),
    ("/messages", "messages"),
    ("/completions", "completions"),
    ("/embeddings", "embeddings"),
)


def endpoint_of(path: str) -> str | None:
    """The API a request path calls: ``/v1/chat/completions`` is ``chat``, ... else ``other``.

    ``/v1/responses/{id}`` (a stored response) is ``responses`` too; a query
    string is not part of an ASGI path. The gateway's own paths (``/_payonce/...``:
    an answer fetched after a timed-out attempt) call no provider API: ``None``.
    """
    if path.startswith("/_payonce/"):
        return None
    path = path.rstrip("/")
    for ending, endpoint in _ENDINGS:
        if path.endswith(ending):
            return endpoint
    if "/responses/" in path:
        return "responses"
    return "other"


class Scenarios:
    """Which headers name a request's scenario, and which scenarios the metrics label."""

    __slots__ = ("_labels", "allowed", "by_tenant", "headers")

    def __init__(
        self,
        headers: Iterable[str] = (),
        allowed: Iterable[str] = (),
        by_tenant: Mapping[str, str] | None = None,
    ) -> None:
        names = [SCENARIO_HEADER, *(name.lower() for name in headers)]
        self.headers = tuple(dict.fromkeys(name.encode("latin-1") for name in names))
        self.allowed = tuple(dict.fromkeys(name for name in allowed if name))
        self._labels = {name: name for name in self.allowed}
        # The scenario of a credential's requests that name none (--credential-scenario).
        self.by_tenant = dict(by_tenant or {})

    def of(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The scenario a request names: the first of the scenario headers it sends."""
        found: dict[bytes, bytes] = {}
        wanted = self.headers
        for name, value in headers:
            if name in wanted and name not in found:
                found[name] = value
        for name in wanted:
            raw = found.get(name)
            if raw is not None:
                text = raw.decode("utf-8", "replace").strip()
                if text:
                    return text
        return None

    def label(self, scenario: str | None) -> str:
        """The metrics label of ``scenario``: itself if listed, else ``other`` (``none``)."""
        if scenario is None:
            return NO_SCENARIO
        return self._labels.get(scenario, OTHER_SCENARIO)

    def labels(self) -> tuple[str, ...]:
        """Every label value the metrics can carry: the list, ``other`` and ``none``."""
        return (*self.allowed, OTHER_SCENARIO, NO_SCENARIO)
