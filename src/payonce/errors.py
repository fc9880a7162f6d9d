"""The one exception tree of payonce, grouped by what the caller should do.

::

    PayonceError
    ├── ConfigError (ValueError)               bad flag, env var or config file: exit code 2
    │   └── CommandNotFound                    payonce run: no such program: exit code 127
    ├── StorageError (ConnectionError)         a store could not answer; its message is
    │   └── StorageTimeout (TimeoutError)      for the operator's log, never for a caller
    ├── ProblemError                           answered as application/problem+json
    │   ├── InvalidIdempotencyKey (ValueError)  400, never retry
    │   ├── IdempotencyKeyRequired (ValueError) 400, never retry
    │   ├── CredentialRequired (PermissionError) 401, never retry
    │   ├── BodyTooLarge (ValueError)           413, never retry
    │   ├── BadRequestTarget (ValueError)       400, never retry (``GET *``)
    │   ├── MalformedRequest (ValueError)       400, never retry (not HTTP/1.1)
    │   ├── BadQuery (ValueError)               400: a /_payonce/ query parameter is invalid
    │   ├── Unauthorized                        401: /_payonce/metrics without its token
    │   ├── NotFound (LookupError)              404
    │   ├── Abandoned (LookupError)             404: its holder died; re-send with the key
    │   ├── MethodNotAllowed                    405: /_payonce/ answers GET and HEAD only
    │   ├── RequestTimeout (TimeoutError)       408: the request did not arrive in time
    │   ├── ExpectationFailed (ValueError)      417: an Expect other than 100-continue
    │   ├── TransferCodingNotImplemented        501: a transfer coding besides chunked
    │   ├── HeadersTooLarge (ValueError)        431, never retry
    │   ├── RequestInProgress                   409 + Retry-After: retry later
    │   ├── TenantLimited                       429 + Retry-After: a per-tenant limit
    │   │   ├── TooManyInFlight                 --max-inflight-per-tenant
    │   │   └── TooManyNewKeys                  --max-new-keys-per-tenant
    │   ├── FingerprintMismatch (ValueError)    422, never retry
    │   ├── StreamNotResumable (LookupError)    412: Last-Event-ID names a run that is gone
    │   ├── UpstreamUnavailable (ConnectionError) 502: retry with the same key
    │   ├── UpstreamTimeout (TimeoutError)      504: retry with the same key
    │   ├── ShuttingDown (ConnectionError)      503: stopping; a keyed run goes on, retry
    │   ├── StoreUnavailable (ConnectionError)  503: nothing ran; retry later
    │   │   └── StoreTimeout (TimeoutError)
    │   └── RecordUnreadable                    503: a stored response cannot be decrypted
    └── LeaseLost                               a fenced write lost its lease (internal)

Third-party errors (sqlite3, aiohttp) are translated once, at the boundary of the
module that calls them, with ``raise ... from exc``. Stores raise
:class:`StorageError`, never a problem: its message names the store (an
address, a file, a database number), which the gateway logs and maps, at its
edge, to :class:`StoreUnavailable` or :class:`StoreTimeout` with a fixed detail
(``payonce.gateway.store_failures``).
"""

from __future__ import annotations

__all__ = [
    "Abandoned",
    "BadQuery",
    "BadRequestTarget",
    "BodyTooLarge",
    "CommandNotFound",
    "ConfigError",
    "CredentialRequired",
    "ExpectationFailed",
    "FingerprintMismatch",
    "HeadersTooLarge",
    "IdempotencyKeyRequired",
    "InvalidIdempotencyKey",
    "LeaseLost",
    "MalformedRequest",
    "MethodNotAllowed",
    "NotFound",
    "PayonceError",
    "ProblemError",
    "RecordUnreadable",
    "RequestInProgress",
    "RequestTimeout",
    "ShuttingDown",
    "StorageError",
    "StorageTimeout",
    "StoreTimeout",
    "StoreUnavailable",
    "StreamNotResumable",
    "TenantLimited",
    "TooManyInFlight",
    "TooManyNewKeys",
    "TransferCodingNotImplemented",
    "Unauthorized",
    "UpstreamTimeout",
    "UpstreamUnavailable",
]

PROBLEM_BASE = "https://github.com/payonce/payonce/blob/main/docs/problems.md#"


class PayonceError(Exception):
    """Base of every error payonce raises on purpose."""


class ConfigError(PayonceError, ValueError):
    """Invalid configuration. The CLI prints the message on one line and exits 2."""

    exit_code = 2


class CommandNotFound(ConfigError):
    """``payonce run`` was given a program that is not on ``PATH`` (exit 127, as a shell)."""

    exit_code = 127


class StorageError(PayonceError, ConnectionError):
    """A store could not answer (connection refused or reset, a full disk, a bad database).

    The message says why, in the store's own words, and names where the store
    is: it is for the operator's log. Callers are answered a
    :class:`StoreUnavailable` problem with a fixed detail instead.
    """


class StorageTimeout(StorageError, TimeoutError):
    """A store did not answer in time (a stalled Redis, an SQLite lock held past ``?timeout=``)."""


class LeaseLost(PayonceError):
    """A write was refused because the writer's lease (fencing token) is no longer current."""


class ProblemError(PayonceError):
    """An error the gateway answers as an RFC 9457 ``application/problem+json`` body.

    ``should_retry`` becomes the ``x-should-retry`` header, which the official
    OpenAI and Anthropic SDKs obey over their own status-code rules.
    """

    status: int = 500
    slug: str = "error"
    title: str = "Internal error"
    should_retry: bool | None = None
    # Header fields the answer must carry besides the problem's own (a 405's Allow).
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def __init__(self, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after

    @property
    def type_uri(self) -> str:
        return PROBLEM_BASE + self.slug


class InvalidIdempotencyKey(ProblemError, ValueError):
    status, slug, title, should_retry = 400, "invalid-key", "Invalid Idempotency-Key", False


class IdempotencyKeyRequired(ProblemError, ValueError):
    status, slug, title, should_retry = 400, "key-required", "Idempotency-Key required", False


class CredentialRequired(ProblemError, PermissionError):
    # --require-credential: a keyed request without a credential would share the
    # anonymous tenant's records with every other such caller.
    status, slug, title, should_retry = 401, "credential-required", "Credential required", False
    # RFC 9110 section 15.5.2: a 401 MUST name a scheme; the API key goes as a bearer token.
    headers = ((b"www-authenticate", b'Bearer realm="payonce"'),)


class BodyTooLarge(ProblemError, ValueError):
    status, slug, title, should_retry = 413, "body-too-large", "Request body too large", False


class BadRequestTarget(ProblemError, ValueError):
    # RFC 9112 section 3.2: only OPTIONS may use the asterisk form, and a proxied
    # request needs a path to send upstream (origin or absolute form).
    status, slug, title, should_retry = 400, "bad-request-target", "Bad request target", False


class MalformedRequest(ProblemError, ValueError):
    # RFC 9112 section 2.2: a message that cannot be parsed gets a 400 and the
    # connection is closed. Answered by the connection itself, like 431.
    status, slug, title, should_retry = 400, "malformed-request", "Malformed request", False


class HeadersTooLarge(ProblemError, ValueError):
    # RFC 6585 section 5: 431 when the header fields, together or one of them,
    # are too large. Answered by the connection itself, before the app sees it.
    status, slug, title, should_retry = (
        431,
        "headers-too-large",
        "Request header fields too large",
        False,
    )


class RequestTimeout(ProblemError, TimeoutError):
    # RFC 9110 section 15.5.9: 408 when the server did not receive a complete
    # request in the time it was prepared to wait. Nothing ran, so repeating the
    # request is safe (the client "MAY repeat that request").
    status, slug, title, should_retry = 408, "request-timeout", "Request timeout", True


class ExpectationFailed(ProblemError, ValueError):
    # RFC 9110 section 10.1.1: a server that receives an Expect other than
    # 100-continue MAY answer 417. The gateway reads the whole body before it
    # forwards anything, so it can meet no other expectation; forwarded, the
    # upstream's own 417 (plain text) was relayed, and keyed, stored.
    # Answered by the connection itself, like 431.
    status, slug, title, should_retry = 417, "expectation-failed", "Expectation failed", False


class TransferCodingNotImplemented(ProblemError):
    # RFC 9112 section 6.1: a server that receives a request with a transfer
    # coding it does not understand SHOULD answer 501. The gateway does not
    # decode gzip or deflate bodies: de-chunked, they went upstream still encoded.
    status, slug, title, should_retry = (
        501,
        "transfer-coding-not-implemented",
        "Transfer coding not implemented",
        False,
    )


class BadQuery(ProblemError, ValueError):
    status, slug, title, should_retry = 400, "bad-query", "Bad query parameter", False


class Unauthorized(ProblemError):
    # --metrics-token is set and the scrape did not send it.
    status, slug, title, should_retry = 401, "unauthorized", "Metrics token required", False
    # RFC 9110 section 15.5.2: a 401 MUST name the scheme that would be accepted.
    headers = ((b"www-authenticate", b'Bearer realm="payonce metrics"'),)


class MethodNotAllowed(ProblemError):
    status, slug, title, should_retry = 405, "method-not-allowed", "Method not allowed", False
    # RFC 9110 section 15.5.6: a 405 MUST say which methods the resource allows.
    headers = ((b"allow", b"GET, HEAD"),)


class NotFound(ProblemError, LookupError):
    status, slug, title, should_retry = 404, "not-found", "No such record", False


class Abandoned(ProblemError, LookupError):
    # The record exists (a request with another body still gets 422), but its
    # lease lapsed: nobody runs it and no response will come. Not "not-found",
    # which would be untrue; not 409, which says "ask again later".
    status, slug, title, should_retry = 404, "abandoned", "Nobody is running this request", False


class RequestInProgress(ProblemError):
    # IETF draft-ietf-httpapi-idempotency-key-header section 2.7: 409 while the
    # original request is still being processed. Retrying later is correct.
    status, slug, title, should_retry = 409, "in-progress", "Request still in progress", True


class TenantLimited(ProblemError):
    # RFC 6585 section 4: 429 with Retry-After. Nothing ran and no key was
    # claimed, so the retry (with the same key) is safe; the SDKs wait and retry.
    status, slug, title, should_retry = 429, "tenant-limited", "Per-tenant limit reached", True
    limit = "other"  # the metrics label of payonce_tenant_limited_total


class TooManyInFlight(TenantLimited):
    slug, title = "too-many-in-flight", "Too many requests in flight for this credential"
    limit = "in_flight"


class TooManyNewKeys(TenantLimited):
    slug, title = "too-many-new-keys", "Too many new idempotency keys for this credential"
    limit = "new_keys"


class FingerprintMismatch(ProblemError, ValueError):
    # Same draft, section 2.7: 422 when a key is reused with a different payload.
    status, slug, title, should_retry = (
        422,
        "fingerprint-mismatch",
        "Idempotency-Key reused with a different request",
        False,
    )


class StreamNotResumable(ProblemError, LookupError):
    # A Last-Event-ID resume of a stream whose run is gone (its upstream died, its
    # gateway stopped, another run replaced it) or that names no run (a plain
    # number): the continuation of those events cannot be sent, and the events of
    # another run after them would splice two answers. RFC 9110 section 15.5.13:
    # 412, a precondition of the request (the run it continues) does not hold.
    # Retrying the same resume cannot help; starting over (without Last-Event-ID)
    # is the client's decision, since it may run and bill the request again.
    status, slug, title, should_retry = (
        412,
        "stream-not-resumable",
        "This stream cannot be resumed",
        False,
    )


class UpstreamUnavailable(ProblemError, ConnectionError):
    status, slug, title, should_retry = 502, "upstream-unavailable", "Upstream unavailable", True


class UpstreamTimeout(ProblemError, TimeoutError):
    status, slug, title, should_retry = 504, "upstream-timeout", "Upstream timed out", True


class ShuttingDown(ProblemError, ConnectionError):
    """A request still open when the server stopped waiting for it, after SIGTERM.

    Its keyed run, if any, goes on while the gateway drains and stores its answer.
    """

    status, slug, title, should_retry = 503, "shutting-down", "Gateway shutting down", True


class StoreUnavailable(ProblemError, ConnectionError):
    # docs/gateway.md, "Failure modes": with a key and no store, answer 503; never run unprotected.
    # The answer to a StorageError: stores raise that, the gateway's edge this.
    status, slug, title, should_retry = (
        503,
        "store-unavailable",
        "Idempotency store unavailable",
        True,
    )


class StoreTimeout(StoreUnavailable, TimeoutError):
    slug, title = "store-timeout", "Idempotency store timed out"


class RecordUnreadable(ProblemError):
    # A stored response encrypted with a key this gateway lacks, or altered
    # (payonce.store.sealing). Not a StoreUnavailable: --on-store-failure open
    # must not forward it, since its first run was paid for and the operator can
    # make the record readable again by adding the key. Not a 500: nothing is
    # broken in payonce. Retrying is useless until the operator acts.
    status, slug, title, should_retry = (
        503,
        "record-unreadable",
        "Stored response cannot be decrypted",
        False,
    )
