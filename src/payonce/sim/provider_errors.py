"""Error responses in each provider's own JSON shape.

SDKs parse these bodies to build their exceptions, so the shapes follow the
providers' documented error formats:

* OpenAI: ``{"error": {"message", "type", "param", "code"}}``
* Anthropic: ``{"type": "error", "error": {"type", "message"}}``
"""

from __future__ import annotations

import enum
import json

from payonce.errors import PayonceError

__all__ = ["Api", "BadRequest", "error_body"]


class Api(enum.Enum):
    """Which provider's API an endpoint imitates; decides the error shape."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class BadRequest(PayonceError, ValueError):
    """The request cannot be served as sent: answered 400 and never billed."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


# OpenAI's "type" per status, as its API answers them.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    429: "requests",
    503: "server_error",
}
_OPENAI_MESSAGES = {
    429: "Rate limit reached (simulated by payonce sim).",
    500: "The server had an error while processing your request (simulated by payonce sim).",
    503: "The engine is currently overloaded, please try again later (simulated by payonce sim).",
}
_OPENAI_CODES = {429: "rate_limit_exceeded"}

# Anthropic's documented error types per status.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_body(
    api: Api,
    status: int,
    message: str | None = None,
    *,
    param: str | None = None,
    code: str | None = None,
) -> bytes:
    """The JSON error body ``api`` answers with ``status``; a stock message if none given."""
    if api is Api.ANTHROPIC:
        kind = _ANTHROPIC_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        text = message or f"Simulated {status} error (payonce sim)."
        return json.dumps(
            {"type": "error", "error": {"type": kind, "message": text}}, separators=(",", ":")
        ).encode()
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    text = message or _OPENAI_MESSAGES.get(status, f"Simulated {status} error (payonce sim).")
    payload = {
        "error": {
            "message": text,
            "type": kind,
            "param": param,
            "code": code if code is not None else _OPENAI_CODES.get(status),
        }
    }
    return json.dumps(payload, separators=(",", ":")).encode()
