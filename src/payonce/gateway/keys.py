"""Reading the idempotency key, the tenant and the request fingerprint from a request.

The key follows draft-ietf-httpapi-idempotency-key-header: an RFC 8941 sf-string
(quoted on the wire), though most clients send it bare, so both are accepted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from urllib.parse import unquote_to_bytes

import orjson

from payonce.credentials import CREDENTIAL_HEADERS
from payonce.errors import InvalidIdempotencyKey

__all__ = [
    "ANONYMOUS",
    "DEFAULT_CREDENTIAL_HEADERS",
    "MAX_KEY_LENGTH",
    "Tenants",
    "fingerprint",
    "is_json",
    "parse_key",
    "parse_path_key",
    "read_key",
    "tenant_of",
]

MAX_KEY_LENGTH = 255  # Stripe's limit; the draft sets none.
DEFAULT_CREDENTIAL_HEADERS = tuple(name.encode() for name in CREDENTIAL_HEADERS)
# The tenant of requests that carry no credential: they all share it (docs/gateway.md,
# "Security notes"); --require-credential refuses keyed ones instead.
ANONYMOUS = "anonymous"
_SALT = b"payonce-tenant\x00"


def parse_key(raw: bytes) -> str:
    """Validate one header value and return the key.

    Accepts a bare value (1-255 printable ASCII, no spaces) or an RFC 8941
    sf-string (``"..."`` with ``\\"`` and ``\\\\`` escapes) whose content is 1-255
    printable ASCII characters. Raises :class:`InvalidIdempotencyKey` otherwise.
    """
    try:
        text = raw.decode("ascii").strip(" \t")
    except UnicodeDecodeError:
        raise InvalidIdempotencyKey("Idempotency-Key must be printable ASCII") from None
    if text.startswith('"'):
        key = _parse_sf_string(text)
    else:
        key = text
        if not key or any(not 0x21 <= ord(ch) <= 0x7E for ch in key):
            raise InvalidIdempotencyKey(
                "Idempotency-Key must be 1-255 printable ASCII characters without spaces, "
                'or an RFC 8941 quoted string such as "order-42"'
            )
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(
            f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} characters long, got {len(key)}"
        )
    return key


def parse_path_key(segment: str) -> str:
    """The key named by a ``/_payonce/requests/{key}`` path segment, read as the header is.

    Percent-decoded first. A value that begins with a double quote is an RFC 8941
    quoted string, as in the header: ``%22k1%22`` (or ``"k1"``) is the key ``k1``,
    which the header ``Idempotency-Key: "k1"`` named. Anything else is the key as
    it stands, 1-255 printable ASCII characters, spaces included: a key sent
    quoted because of a space (``"order 42"``) is ``order%2042`` in the path. A
    key that itself begins with a double quote is written quoted in the path too.
    Raises :class:`InvalidIdempotencyKey` otherwise.
    """
    raw = unquote_to_bytes(segment)
    if raw.startswith(b'"'):
        return parse_key(raw)
    key = raw.decode("latin-1")
    if not 1 <= len(key) <= MAX_KEY_LENGTH or any(not 0x20 <= ord(ch) <= 0x7E for ch in key):
        raise InvalidIdempotencyKey(
            f"the key in the path must be 1-{MAX_KEY_LENGTH} printable ASCII characters,"
            ' or an RFC 8941 quoted string such as "order-42" (percent-encoded)'
        )
    return key


def _parse_sf_string(text: str) -> str:
    # RFC 8941 section 4.2.5: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE
    out: list[str] = []
    index = 1
    while index < len(text):
        ch = text[index]
        if ch == "\\":
            index += 1
            if index >= len(text) or text[index] not in '"\\':
                raise InvalidIdempotencyKey("Idempotency-Key: bad escape in quoted string")
            out.append(text[index])
        elif ch == '"':
            if index != len(text) - 1:
                raise InvalidIdempotencyKey("Idempotency-Key: text after the closing quote")
            return "".join(out)
        elif not 0x20 <= ord(ch) <= 0x7E:
            raise InvalidIdempotencyKey("Idempotency-Key must be printable ASCII")
        else:
            out.append(ch)
        index += 1
    raise InvalidIdempotencyKey("Idempotency-Key: quoted string has no closing quote")


def read_key(headers: Sequence[tuple[bytes, bytes]], names: Sequence[bytes]) -> str | None:
    """The key carried by any of the header ``names``, or ``None`` when there is none.

    Several key headers that disagree are refused: guessing which one the client
    meant could run a request twice or replay the wrong result.
    """
    found: str | None = None
    for name, value in headers:
        if name in names:
            key = parse_key(value)
            if found is not None and key != found:
                key = _explicit_of(found, key)
            found = key
    return found


# What the official SDKs (Stainless-generated: openai, anthropic, in Python and
# Node) mint once per call: "stainless-python-retry-<uuid4>".
_MINTED_PREFIX = "stainless-"
_MINTED_INFIX = "-retry-"


def _is_minted(key: str) -> bool:
    return key.startswith(_MINTED_PREFIX) and _MINTED_INFIX in key[len(_MINTED_PREFIX) :]


def _explicit_of(first: str, second: str) -> str:
    """Of two different keys, the one the application chose over the one its SDK minted.

    With ``client._idempotency_header`` set, the SDK sends its own per-call key
    in that header even when the application passes a business key in another
    one (``X-Idempotency-Key``); the business key is the one that spans the
    application's own retries, so it wins (docs/gateway.md, "The key"). Two keys that
    were both chosen, or both minted, are refused.
    """
    first_minted, second_minted = _is_minted(first), _is_minted(second)
    if first_minted and not second_minted:
        return second
    if second_minted and not first_minted:
        return first
    raise InvalidIdempotencyKey(
        "the request carries several different idempotency keys"
        " (a key minted by the SDK, stainless-...-retry-..., yields to any other)"
    )


def tenant_of(
    headers: Sequence[tuple[bytes, bytes]],
    tenant_header: bytes | None = None,
    credential_headers: Sequence[bytes] = DEFAULT_CREDENTIAL_HEADERS,
) -> str:
    """A hash naming the caller, so two credentials never share a record.

    The credential itself is never stored or logged, only this hash. ``Bearer``
    is dropped so one API key sent as ``Authorization`` (OpenAI SDK) or as
    ``x-api-key`` (Anthropic SDK) is one tenant. A request carrying several
    credentials (a proxy's token and a provider key) is the tenant of all of
    them together: sharing one of them must not be enough to share records.
    Without any, the request is in the one :data:`ANONYMOUS` tenant.
    """
    wanted = (tenant_header,) if tenant_header else tuple(credential_headers)
    return _tenant_of_values([value for name, value in headers if name in wanted])


def tenant_of_credential(credential: str) -> str:
    """The tenant id the gateway logs for requests carrying only ``credential``.

    ``credential`` is what the client sends as its key (``sk-...``, or the header
    value with ``Bearer``), or the value of ``--tenant-header``. What ``payonce
    tenant-id`` prints, to write a reconcile ``--key-map`` without the log.
    """
    return _tenant_of_values([credential.encode("utf-8", "surrogateescape")])


def _tenant_of_values(values: Sequence[bytes]) -> str:
    secrets = sorted({secret for secret in map(_secret, values) if secret})
    if not secrets:
        return ANONYMOUS
    if len(secrets) == 1:
        return _digest(secrets[0])
    # Length-prefixed, so no list of secrets can read as another list or as one.
    joined = b"".join(len(secret).to_bytes(4, "big") + secret for secret in secrets)
    return _digest(b"several\x00" + joined)


def _secret(value: bytes) -> bytes:
    secret = value.strip()
    if secret[:7].lower() == b"bearer ":
        secret = secret[7:].strip()
    elif secret.lower() == b"bearer":
        # "Bearer " with an empty key (stripped by the way): no credential at all,
        # not a secret every caller without a key would share.
        return b""
    return secret


def _digest(secret: bytes) -> str:
    return hashlib.sha256(_SALT + secret).hexdigest()[:32]


def _tenant_hash(value: bytes) -> str | None:
    secret = _secret(value)
    return _digest(secret) if secret else None


class Tenants:
    """:func:`tenant_of` for one gateway, remembering the tenants of recent credentials.

    A sha256 per request was a fifth of what the call log costs (benchmarks/NOTEBOOK.md,
    observability), and a client sends the same credential on every request. The
    memory is keyed by two of Python's own hashes of the header value (SipHash
    with this process's random key, over two different inputs): 128 bits that
    cannot be turned back into the credential, which is still never kept. At
    ``size`` entries the memory is cleared and starts again. Requests with
    several credentials (rare) are hashed each time.
    """

    def __init__(
        self,
        tenant_header: bytes | None = None,
        size: int = 4096,
        credential_headers: Sequence[bytes] = DEFAULT_CREDENTIAL_HEADERS,
    ) -> None:
        self._wanted = (tenant_header,) if tenant_header else tuple(credential_headers)
        self._size = size
        self._known: dict[tuple[int, int], str] = {}

    def of(self, headers: Sequence[tuple[bytes, bytes]]) -> str:
        wanted = self._wanted
        found: bytes | None = None
        several: list[bytes] | None = None
        for name, value in headers:
            if name in wanted:
                if found is None:
                    found = value
                elif several is None:
                    several = [found, value]
                else:
                    several.append(value)
        if found is None:
            return ANONYMOUS
        if several is not None:
            return _tenant_of_values(several)
        digest = (hash(found), hash(_SALT + found))
        tenant = self._known.get(digest)
        if tenant is not None:
            return tenant
        tenant = _tenant_hash(found)
        if tenant is None:
            return ANONYMOUS
        if len(self._known) >= self._size:
            self._known.clear()
        self._known[digest] = tenant
        return tenant


def _canonical_json(body: bytes) -> bytes:
    """The canonical form of a JSON body, or the body itself where there is none.

    Defined for every body (docs/gateway.md, "Same request?"), so a request an upstream
    would take never fails here. Which branch a body takes depends only on the
    value it holds (never on its key order or whitespace), and no two branches
    produce the same bytes for different values: each canonical output parses
    back to its own value, and a raw body is one no branch could parse.
    """
    # orjson (sorted keys, compact, UTF-8) is ten times faster than json: the
    # keyed hot path. Integers past 64 bits and floats are read as IEEE doubles.
    try:
        return orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            return body  # nested past 1,024 levels: the raw bytes are the fingerprint
    except orjson.JSONEncodeError:
        pass
    # What orjson refuses: NaN and Infinity, numbers past a double (1e400), UTF-16
    # and UTF-32 bodies, lone surrogate escapes ("\ud83d", a cut emoji).
    try:
        parsed = json.loads(body)
        text = json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        # Not JSON after all (UnicodeDecodeError is a ValueError), or nested past
        # what the recursive json module reads: the raw bytes are the fingerprint.
        return body
    try:
        return text.encode()
    except UnicodeEncodeError:
        # A lone surrogate has no UTF-8 form: keep every non-ASCII character
        # escaped instead (bytes no UTF-8 output of another value can equal).
        return json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode()


def is_json(content_type: bytes | None) -> bool:
    """Whether a body is canonicalised as JSON: no Content-Type, or a JSON media type.

    The media type is compared case-insensitively and its parameters are ignored
    (RFC 9110 section 8.3.1): ``Application/JSON; charset=utf-8`` is JSON, and so
    is any type naming json (``application/vnd.api+json``, ``application/x-ndjson``).
    """
    if content_type is None or content_type == b"application/json":
        return True
    return content_type.split(b";", 1)[0].lower().find(b"json") >= 0  # not ``in``: sse.py


def fingerprint(method: str, path: str, body: bytes, content_type: bytes | None) -> str:
    """sha256 over method, path and body; JSON bodies are canonicalised first.

    Canonical JSON sorts object keys and drops insignificant whitespace, so key
    order does not matter while array order does (docs/gateway.md, "The contract").
    """
    canonical = body
    if body and is_json(content_type):
        canonical = _canonical_json(body)
    digest = hashlib.sha256()
    digest.update(method.encode() + b"\x00" + path.encode() + b"\x00")
    digest.update(canonical)
    return digest.hexdigest()
