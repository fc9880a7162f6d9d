"""The incoming request as the gateway sees it, read once from the ASGI scope."""

from __future__ import annotations

from dataclasses import dataclass

from payonce.gateway.upstream import HOP_BY_HOP

__all__ = ["ProxiedRequest", "header"]


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header ``name`` (lowercase), or ``None``."""
    for key, value in headers:
        if key == name:
            return value
    return None


@dataclass(frozen=True, slots=True)
class ProxiedRequest:
    method: str
    raw_path: str
    query: str
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def upstream_headers(self) -> list[tuple[str, str]]:
        """Headers to forward: everything but hop-by-hop fields (RFC 9110 section 7.6.1)."""
        forwarded = []
        for raw_name, raw_value in self.headers:
            name = raw_name.decode("latin-1")
            if name not in HOP_BY_HOP:
                forwarded.append((name, raw_value.decode("latin-1")))
        return forwarded
