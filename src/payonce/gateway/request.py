"""The incoming request as the gateway sees it, read once from the ASGI scope."""

from __future__ import annotations

from dataclasses import dataclass

from payonce.gateway.asgi import BodyWriter
from payonce.gateway.upstream import HOP_BY_HOP_BYTES

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
    # Writes body chunks of the response straight away, where the server offers it.
    write_body: BodyWriter | None = None

    def upstream_headers(self) -> list[tuple[bytes, bytes]]:
        """Headers to forward: everything but hop-by-hop fields (RFC 9110 section 7.6.1).

        As the server handed them over (lowercase names, raw values): they are
        written to the upstream as they are, never decoded. The fields a
        ``Connection`` header names are this hop's too, and stay here.
        """
        dropped = HOP_BY_HOP_BYTES
        for name, value in self.headers:
            if name == b"connection":
                dropped = dropped.union(token.strip().lower() for token in value.split(b","))
        return [field for field in self.headers if field[0] not in dropped]
