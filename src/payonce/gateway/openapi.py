"""The OpenAPI 3.1 description of the gateway's own endpoints, served at ``/_payonce/openapi.json``.

Built from the same constants the endpoints use (the key's length, the longest
``wait``, the problem classes), so a bound changed in one place changes here too.
``tests/gateway/test_openapi.py`` checks that its paths are exactly the routes
``admin.ROUTES`` dispatches, that it is valid OpenAPI 3.1, and runs schemathesis
against a live gateway with it.

Only ``/_payonce/`` is described: every other path is the upstream's API,
proxied (docs/gateway.md).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from payonce import __version__
from payonce.errors import (
    PROBLEM_BASE,
    Abandoned,
    BadQuery,
    CredentialRequired,
    ExpectationFailed,
    HeadersTooLarge,
    InvalidIdempotencyKey,
    MalformedRequest,
    MethodNotAllowed,
    NotFound,
    ProblemError,
    RecordUnreadable,
    RequestInProgress,
    RequestTimeout,
    StoreTimeout,
    StoreUnavailable,
    TransferCodingNotImplemented,
    Unauthorized,
)
from payonce.gateway.keys import MAX_KEY_LENGTH

__all__ = ["MAX_WAIT", "openapi_document", "openapi_json", "problem_slugs"]

MAX_WAIT = 300.0  # seconds: the longest ?wait= long-poll

Json = dict[str, Any]
# A description and the problem classes it explains.
_Problems = tuple[str, tuple[type[ProblemError], ...]]

# What the connection itself may answer on any path (gateway/protocol.py).
_CONNECTION = (
    MalformedRequest,
    RequestTimeout,
    ExpectationFailed,
    HeadersTooLarge,
    TransferCodingNotImplemented,
)


def _slug_classes() -> dict[str, type[ProblemError]]:
    classes: list[type[ProblemError]] = [
        InvalidIdempotencyKey,
        BadQuery,
        CredentialRequired,
        Unauthorized,
        NotFound,
        Abandoned,
        MethodNotAllowed,
        RequestInProgress,
        StoreUnavailable,
        StoreTimeout,
        RecordUnreadable,
        *_CONNECTION,
    ]
    return {error.slug: error for error in classes}


def _problem_schema(errors: list[type[ProblemError]]) -> Json:
    return {
        "allOf": [
            {"$ref": "#/components/schemas/Problem"},
            {
                "type": "object",
                "properties": {
                    "type": {"enum": sorted(PROBLEM_BASE + error.slug for error in errors)},
                    "status": {"const": errors[0].status},
                },
            },
        ]
    }


def _problem(description: str, *errors: type[ProblemError]) -> Json:
    """One status code's problem responses: their ``type``s and the headers SDKs act on."""
    statuses = {error.status for error in errors}
    assert len(statuses) == 1, "one response object per status code"
    headers: Json = {}
    retry = {error.should_retry for error in errors}
    if None not in retry:
        headers["x-should-retry"] = {
            "description": "Whether the official SDKs should retry (they obey it).",
            "required": True,
            "schema": {"enum": sorted("true" if value else "false" for value in retry)},
        }
    if errors[0] is RequestInProgress:
        headers["Retry-After"] = {
            "description": "Seconds to wait before asking again.",
            "required": True,
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
        }
    for name, _ in sorted({pair for error in errors for pair in error.headers}):
        headers[name.decode().title()] = {"required": True, "schema": {"type": "string"}}
    links = ", ".join(f"[`{error.slug}`](problems.md#{error.slug})" for error in errors)
    response: Json = {
        "description": f"{description} Problem types: {links}.",
        "content": {"application/problem+json": {"schema": _problem_schema(list(errors))}},
    }
    if headers:
        response["headers"] = headers
    return response


def _responses(ok: Json, *problems: _Problems) -> Json:
    """``ok`` as the 200, the endpoint's problems, then what the connection may answer."""
    by_status: dict[int, tuple[list[str], list[type[ProblemError]]]] = {}
    for description, errors in (*problems, *((e.title + ".", (e,)) for e in _CONNECTION)):
        for error in errors:
            texts, classes = by_status.setdefault(error.status, ([], []))
            if description not in texts:
                texts.append(description)
            classes.append(error)
    responses: Json = {"200": ok}
    for status in sorted(by_status):
        texts, classes = by_status[status]
        responses[str(status)] = _problem(" ".join(texts), *classes)
    return responses


_KEY = {
    "name": "key",
    "in": "path",
    "required": True,
    "description": (
        "The Idempotency-Key the request was sent with, percent-encoded where it holds"
        " reserved characters (`order%2F42`); 1-255 printable ASCII characters once decoded."
    ),
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_LENGTH,
        "pattern": "^[ -~]+$",
    },
}
_WAIT = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": (
        "Long-poll: answer when the record changes (completes, is released, records new"
        " stream events, is taken over, its lease lapses) or after this many seconds."
    ),
    "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT},
}
# The tenant is the hash of whichever of these the request carries (docs/gateway.md,
# "Tenants"); none at all is the anonymous tenant, hence the empty alternative.
_TENANT_SECURITY: list[Json] = [
    {},
    {"bearerCredential": []},
    {"xApiKey": []},
    {"apiKey": []},
    {"xGoogApiKey": []},
]
_RECORD_PROBLEMS: tuple[_Problems, ...] = (
    ("The key in the path or the `wait` query is invalid.", (InvalidIdempotencyKey, BadQuery)),
    ("`--require-credential` and the request carries no credential.", (CredentialRequired,)),
    ("The store cannot answer.", (StoreUnavailable, StoreTimeout)),
    (
        "The stored response is encrypted with a key this gateway lacks (docs/gateway.md,"
        " Encryption at rest).",
        (RecordUnreadable,),
    ),
)


def _schemas() -> Json:
    nullable_time = {"type": ["string", "null"], "format": "date-time"}
    return {
        "Problem": {
            "type": "object",
            "description": "RFC 9457 problem details (docs/problems.md).",
            "required": ["type", "title", "status", "detail", "message", "error"],
            "properties": {
                "type": {"type": "string", "format": "uri"},
                "title": {"type": "string"},
                "status": {"type": "integer", "minimum": 400, "maximum": 599},
                "detail": {"type": "string"},
                "instance": {"type": "string"},
                "message": {
                    "type": "string",
                    "description": "`detail` again, for the openai SDKs' error text.",
                },
                "error": {
                    "type": "object",
                    "description": "The error object the openai and anthropic SDKs"
                    " (Python and Node) read: `detail` as `message`, the problem's"
                    " slug as `type` and `code`.",
                    "required": ["message", "type", "code"],
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "code": {"type": "string"},
                    },
                },
            },
        },
        "Health": {
            "type": "object",
            "required": ["status", "store"],
            "additionalProperties": False,
            "properties": {
                "status": {"enum": ["ok", "degraded"]},
                "store": {"enum": ["ok", "unavailable"]},
            },
        },
        "Liveness": {
            "type": "object",
            "required": ["status"],
            "additionalProperties": False,
            "properties": {"status": {"const": "ok"}},
        },
        "Readiness": {
            "type": "object",
            "required": ["status", "store"],
            "additionalProperties": False,
            "properties": {
                "status": {"enum": ["ok", "degraded", "draining", "unavailable"]},
                "store": {"enum": ["ok", "unavailable"]},
                "upstream": {"enum": ["ok", "unavailable"]},
            },
        },
        "Record": {
            "type": "object",
            "description": "One key's record, as its tenant sees it (docs/gateway.md).",
            "required": [
                "key",
                "state",
                "status_code",
                "created_at",
                "completed_at",
                "replays",
                "usage",
                "cost_usd",
                "upstream_request_id",
                "events",
            ],
            "additionalProperties": False,
            "properties": {
                "key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
                "state": {"enum": ["in_progress", "completed", "abandoned"]},
                "status_code": {"type": ["integer", "null"], "minimum": 100, "maximum": 599},
                "created_at": {"type": "string", "format": "date-time"},
                "completed_at": nullable_time,
                "replays": {"type": "integer", "minimum": 0},
                "usage": {
                    "type": ["object", "null"],
                    "additionalProperties": {"type": "integer", "minimum": 0},
                    "description": "input_tokens, output_tokens and, when reported,"
                    " cached_input_tokens and reasoning_tokens.",
                },
                "cost_usd": {"type": ["number", "null"], "minimum": 0},
                "upstream_request_id": {"type": ["string", "null"]},
                "events": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "Events recorded for a stream; null for a whole response.",
                },
            },
        },
    }


def _security_schemes() -> Json:
    def header(name: str) -> Json:
        return {"type": "apiKey", "in": "header", "name": name, "description": "A credential."}

    return {
        "bearerCredential": {
            "type": "http",
            "scheme": "bearer",
            "description": "The caller's API key (OpenAI style): its hash is the tenant.",
        },
        "xApiKey": header("x-api-key"),
        "apiKey": header("api-key"),
        "xGoogApiKey": header("x-goog-api-key"),
        "metricsToken": {
            "type": "http",
            "scheme": "bearer",
            "description": "`--metrics-token`; without it the metrics are open.",
        },
    }


@functools.cache
def openapi_document() -> Json:
    """The OpenAPI 3.1 document (cached: callers only read it)."""
    replayed = {
        "Idempotent-Replayed": {
            "description": "Always true here: this is the stored answer.",
            "required": True,
            "schema": {"const": "true"},
        }
    }
    stored = {
        "description": (
            "The stored response itself, with the status, headers and body the upstream"
            " sent (a stream: its recorded events, then the live ones). An upstream error"
            " stored with the key (a 4xx other than 408/409/429) comes back with its own"
            " status and body, told apart from the gateway's problems by"
            " `Idempotent-Replayed: true`."
        ),
        "headers": replayed,
        "content": {"*/*": {"schema": {}}},
    }
    paths: Json = {
        "/_payonce/health": {
            "get": {
                "operationId": "health",
                "summary": "Whether the gateway and its store answer",
                "responses": _responses(
                    {
                        "description": "Serving (`degraded` with `--on-store-failure open`).",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Health"}}
                        },
                    },
                    ("The store cannot answer.", (StoreUnavailable, StoreTimeout)),
                ),
            }
        },
        "/_payonce/health/live": {
            "get": {
                "operationId": "healthLive",
                "summary": "Liveness: the gateway process answers (checks nothing else)",
                "responses": _responses(
                    {
                        "description": "The process answers.",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/Liveness"}
                            }
                        },
                    }
                ),
            }
        },
        "/_payonce/health/ready": {
            "get": {
                "operationId": "healthReady",
                "summary": "Readiness: the store answers, the gateway is not draining",
                "parameters": [
                    {
                        "name": "upstream",
                        "in": "query",
                        "required": False,
                        "description": (
                            "`true`: also check that a TCP connection to the upstream"
                            " opens (no request is sent)."
                        ),
                        "schema": {"enum": ["true", "false", "1", "0"]},
                    }
                ],
                "responses": {
                    **_responses(
                        {
                            "description": (
                                "Ready (`degraded`: the store does not answer and the"
                                " gateway runs with `--on-store-failure open`)."
                            ),
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/Readiness"}
                                }
                            },
                        },
                        ("`upstream` is not true or false.", (BadQuery,)),
                    ),
                    "503": {
                        "description": (
                            "Not ready: draining after SIGTERM, the store does not answer,"
                            " or (with `upstream=true`) the upstream does not."
                        ),
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/Readiness"}
                            }
                        },
                    },
                },
            }
        },
        "/_payonce/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (docs/observability.md)",
                "security": [{}, {"metricsToken": []}],
                "responses": _responses(
                    {
                        "description": "The Prometheus text exposition format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    ("`--metrics-token` is set and was not sent.", (Unauthorized,)),
                    ("The gateway runs with `--no-metrics`.", (NotFound,)),
                ),
            }
        },
        "/_payonce/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": _responses(
                    {
                        "description": "OpenAPI 3.1.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                ),
            }
        },
        "/_payonce/requests/{key}": {
            "parameters": [_KEY],
            "get": {
                "operationId": "requestStatus",
                "summary": "The record of one key, for the caller's credential",
                "security": _TENANT_SECURITY,
                "parameters": [_WAIT],
                "responses": _responses(
                    {
                        "description": "The record.",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Record"}}
                        },
                    },
                    *_RECORD_PROBLEMS,
                    *(
                        (
                            "No record for this key under this credential: never sent,"
                            " expired, or released after a failure (re-sending is safe).",
                            (NotFound,),
                        ),
                    ),
                ),
            },
        },
        "/_payonce/requests/{key}/response": {
            "parameters": [_KEY],
            "get": {
                "operationId": "storedResponse",
                "summary": "The stored response of one key, for the caller's credential",
                "security": _TENANT_SECURITY,
                "parameters": [_WAIT],
                "responses": {
                    **_responses(
                        stored,
                        *_RECORD_PROBLEMS,
                        *(
                            (
                                "No record for this key (`not-found`), or nobody runs it any"
                                " more (`abandoned`: re-send with the same key).",
                                (NotFound, Abandoned),
                            ),
                            ("A whole response is still running.", (RequestInProgress,)),
                        ),
                    ),
                    "default": stored,
                },
            },
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "payonce gateway: its own endpoints",
            "version": __version__,
            "description": (
                "The endpoints under /_payonce/ (docs/gateway.md). Every other path is"
                " the upstream's API, proxied. Errors are RFC 9457 problem documents"
                " (docs/problems.md). These paths answer GET and HEAD only; any other"
                " method is the 405 in components/responses."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "securitySchemes": _security_schemes(),
            "responses": {
                "MethodNotAllowed": _problem("Any method but GET and HEAD.", MethodNotAllowed)
            },
        },
    }


@functools.cache
def openapi_json() -> bytes:
    """The document as served: compact JSON."""
    return json.dumps(openapi_document(), separators=(",", ":")).encode()


def problem_slugs() -> frozenset[str]:
    """Every problem type the document names (for the test that it names them all)."""
    return frozenset(_slug_classes())
