"""Encryption at rest: the codec the stores call on response bodies, headers and stream events.

A store never writes a response in its own format: it asks its codec for the
stored form of the headers and the body (two byte strings, for its two
columns or fields) and of each event, and hands what it read back to the
codec. :data:`PLAIN` stores them as they are (headers as JSON pairs);
:class:`Sealing` (``PAYONCE_ENCRYPTION_KEY``) encrypts them with AES-256-GCM:
a whole response as one value (headers and body together, in the body's
place; the headers' place holds only :data:`MAGIC`), a stream's headers as one
value and each of its events as one. Everything else in a record (tenant
hash, key, fingerprint, state, times, status code, usage, cost) stays in the
clear: the stores and the status endpoint need it, and it holds no content of
the call.

A sealed value::

    b"\\x00pe\\x01" | key id (4) | salt (8) | nonce (12) | ciphertext | GCM tag (16)

* **key id**: the first 4 bytes of SHA-256 over the key (:func:`key_id`); it
  names the key without revealing it, so a record is opened with the right
  key at once and a record written with a key the gateway lacks is reported
  as such (:class:`~payonce.errors.RecordUnreadable`).
* **salt**: each process encrypts under a key of its own, derived from the
  configured one with HKDF-SHA256 and a random salt, and takes a new salt
  after 2**28 values. Nonces are random (96 bits, ``os.urandom``); NIST SP
  800-38D allows 2**32 random nonces per key, so no derived key comes near it,
  however long a key stays configured.
* **associated data**: the part (``response``, ``headers`` of a stream,
  ``event``), the tenant, the key, and for an event its number. A value copied
  to another record, another tenant, another part or another place in a
  stream does not decrypt.

The leading NUL byte can begin neither JSON headers nor, in practice, an
upstream body or SSE event, so a value says itself whether it is sealed. A
gateway with keys reads plain values (written before encryption was turned
on: turning it on loses no record); a gateway without keys refuses sealed ones
(turning it off without the keys loses those records, and says so, never
replays ciphertext).

Keys: 32 random bytes, base64url (with or without ``=`` padding), several
separated by commas or newlines. The first encrypts; all decrypt (rotation).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import orjson

from payonce.errors import ConfigError, RecordUnreadable
from payonce.store.base import StoredResponse

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "PLAIN",
    "Codec",
    "Sealing",
    "key_id",
    "load_keys",
    "new_key",
    "parse_keys",
]

log = logging.getLogger("payonce.store")

MAGIC = b"\x00pe\x01"
_ID, _SALT, _NONCE = 4, 8, 12
_HEAD = len(MAGIC) + _ID + _SALT + _NONCE
# A fresh derived key after this many values (well under the 2**32 random nonces per key).
_VALUES_PER_SALT = 2**28
_OPENERS_MAX = 4096  # derived keys kept for reading: one per (key, salt) in the store
_SEPARATORS = re.compile(r"[\s,]+")


class Codec(Protocol):
    """What a store calls to turn a response into its stored form and back.

    Every method is pure CPU work (no I/O), cheap enough to run on the event loop.
    """

    def headers_out(self, tenant: str, key: str, headers: tuple[tuple[str, str], ...]) -> bytes:
        """The stored form of the headers of a stream that begins."""
        ...

    def response_out(self, tenant: str, key: str, response: StoredResponse) -> tuple[bytes, bytes]:
        """The stored form of a completed response: what goes where headers and body go."""
        ...

    def events_out(
        self, tenant: str, key: str, first: int, events: Sequence[bytes]
    ) -> Sequence[bytes]:
        """The stored form of events numbered ``first``, ``first + 1``, ..."""
        ...

    def response_in(
        self, tenant: str, key: str, status: int, headers: bytes, body: bytes, stream: bool
    ) -> StoredResponse:
        """The response a record stores; :class:`RecordUnreadable` if it cannot be read."""
        ...

    def events_in(self, tenant: str, key: str, after: int, stored: list[bytes]) -> list[bytes]:
        """The events numbered ``after + 1``, ``after + 2``, ... from their stored form."""
        ...


def _pairs(raw: bytes) -> tuple[tuple[str, str], ...]:
    return tuple((str(name), str(value)) for name, value in orjson.loads(raw))


class _Plain:
    """No encryption: headers as JSON pairs, body and events as they are."""

    def headers_out(self, tenant: str, key: str, headers: tuple[tuple[str, str], ...]) -> bytes:
        return orjson.dumps(headers)

    def response_out(self, tenant: str, key: str, response: StoredResponse) -> tuple[bytes, bytes]:
        return orjson.dumps(response.headers), response.body

    def events_out(
        self, tenant: str, key: str, first: int, events: Sequence[bytes]
    ) -> Sequence[bytes]:
        return events

    def response_in(
        self, tenant: str, key: str, status: int, headers: bytes, body: bytes, stream: bool
    ) -> StoredResponse:
        if headers[:1] == MAGIC[:1]:
            # Headers come first in every read of a response, so a sealed record
            # is refused here before any of its body or events is relayed.
            raise _unreadable(
                key,
                "is encrypted and this gateway has no encryption key: start it with the"
                " key(s) it was written with (PAYONCE_ENCRYPTION_KEY or"
                " --encryption-key-file)",
            )
        return StoredResponse(status, _pairs(headers), body, stream=stream)

    def events_in(self, tenant: str, key: str, after: int, stored: list[bytes]) -> list[bytes]:
        return stored


PLAIN: Codec = _Plain()


def _unreadable(key: str, why: str) -> RecordUnreadable:
    return RecordUnreadable(f"the stored response for Idempotency-Key {key!r} {why}")


def key_id(key: bytes) -> bytes:
    """The 4 bytes that name a key in each value it sealed (a hash: reveals nothing of it)."""
    return hashlib.sha256(b"payonce encryption key id\x00" + key).digest()[:_ID]


def new_key() -> str:
    """A new key: 32 random bytes, base64url without padding (43 characters)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def parse_keys(text: str, source: str) -> tuple[bytes, ...]:
    """Keys separated by commas or whitespace (lines); :class:`ConfigError` names ``source``.

    The message never repeats a key, only its position.
    """
    keys: list[bytes] = []
    for number, item in enumerate((i for i in _SEPARATORS.split(text) if i), start=1):
        try:
            key = base64.urlsafe_b64decode(item + "=" * (-len(item) % 4))
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != 32:
            raise ConfigError(
                f"{source}: key {number} is not 32 bytes in base64url"
                " (make one with `payonce encryption-key`)"
            )
        if key in keys:
            raise ConfigError(f"{source}: key {number} repeats an earlier key")
        keys.append(key)
    if not keys:
        raise ConfigError(f"{source}: no key")
    return tuple(keys)


def load_keys(text: str | None, file: str | None) -> tuple[bytes, ...] | None:
    """The keys of ``PAYONCE_ENCRYPTION_KEY`` (``text``) or ``--encryption-key-file``, or None."""
    if text is not None and file is not None:
        raise ConfigError(
            "--encryption-key-file: PAYONCE_ENCRYPTION_KEY is set too; use one of the two"
        )
    if file is not None:
        try:
            content = Path(file).read_text(encoding="ascii")
        except FileNotFoundError:
            raise ConfigError(f"--encryption-key-file: {file} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--encryption-key-file: cannot read {file}: {exc}") from None
        return parse_keys(content, "--encryption-key-file")
    if text is not None:
        return parse_keys(text, "PAYONCE_ENCRYPTION_KEY")
    return None


def _aad(part: bytes, tenant: str, key: str) -> bytes:
    # Lengths first, so no two (tenant, key) pairs give the same bytes.
    t = tenant.encode("utf-8", "surrogatepass")
    k = key.encode("utf-8", "surrogatepass")
    return b"payonce/1 %s %d:%s %d:%s" % (part, len(t), t, len(k), k)


def _derive(key: bytes, salt: bytes) -> AESGCM:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=b"payonce records v1")
    return AESGCM(hkdf.derive(key))


class Sealing:
    """AES-256-GCM on every stored body, header block and event: encrypt with ``keys[0]``.

    ``keys``: 32-byte keys; the first encrypts, every one decrypts.
    """

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys or any(len(key) != 32 for key in keys):
            raise ValueError("Sealing needs one or more 32-byte keys")
        from cryptography.exceptions import InvalidTag

        self._invalid_tag = InvalidTag
        self._keys = {key_id(key): key for key in keys}
        self._current = keys[0]
        self._current_id = key_id(keys[0])
        self._openers: dict[bytes, AESGCM] = {}  # by key id + salt
        self._warned: set[bytes] = set()
        self._new_salt()

    @property
    def key_ids(self) -> list[str]:
        """The configured keys' ids, in hex, the encrypting one first (for the log)."""
        return [kid.hex() for kid in self._keys]

    def _new_salt(self) -> None:
        salt = os.urandom(_SALT)
        self._sealer = _derive(self._current, salt)
        self._prefix = MAGIC + self._current_id + salt
        self._openers[self._current_id + salt] = self._sealer
        self._left = _VALUES_PER_SALT

    def _seal(self, data: bytes, aad: bytes) -> bytes:
        if self._left <= 0:
            self._new_salt()
        self._left -= 1
        nonce = os.urandom(_NONCE)
        return self._prefix + nonce + self._sealer.encrypt(nonce, data, aad)

    def _open(self, data: bytes, aad: bytes, key: str) -> bytes:
        if data[:4] != MAGIC:
            return data  # written before encryption was turned on
        if len(data) < _HEAD + 16:
            raise _unreadable(key, "is damaged (too short to be an encrypted value)")
        name = data[len(MAGIC) : _HEAD - _NONCE]  # key id + salt
        opener = self._openers.get(name)
        if opener is None:
            master = self._keys.get(name[:_ID])
            if master is None:
                self._warn_unknown(name[:_ID])
                raise _unreadable(
                    key,
                    f"was encrypted with key {name[:_ID].hex()}, which this gateway does not"
                    " have: its operator can add that key after the current one"
                    " (PAYONCE_ENCRYPTION_KEY or --encryption-key-file)",
                )
            if len(self._openers) >= _OPENERS_MAX:
                del self._openers[next(iter(self._openers))]
            opener = self._openers[name] = _derive(master, name[_ID:])
        try:
            return opener.decrypt(data[_HEAD - _NONCE : _HEAD], data[_HEAD:], aad)
        except self._invalid_tag:
            raise _unreadable(
                key,
                "does not decrypt: it was altered, or copied from another record",
            ) from None

    def _warn_unknown(self, kid: bytes) -> None:
        # Once per key and process: the operator needs the fact, not a line per
        # request (and a store full of made-up key ids cannot grow the set for ever).
        if kid not in self._warned and len(self._warned) < 64:
            self._warned.add(kid)
            log.warning(
                "a stored record was encrypted with key %s, which is not configured"
                " (configured: %s); such records are answered 503 record-unreadable",
                kid.hex(),
                ", ".join(self.key_ids),
            )

    def headers_out(self, tenant: str, key: str, headers: tuple[tuple[str, str], ...]) -> bytes:
        return self._seal(orjson.dumps(headers), _aad(b"headers", tenant, key))

    def response_out(self, tenant: str, key: str, response: StoredResponse) -> tuple[bytes, bytes]:
        if response.stream:  # no body: its events are sealed one by one
            return self.headers_out(tenant, key, response.headers), b""
        # One value, not two: a seal costs as much as the rest of storing a response.
        headers = orjson.dumps(response.headers)
        whole = len(headers).to_bytes(4, "big") + headers + response.body
        return MAGIC, self._seal(whole, _aad(b"response", tenant, key))

    def events_out(
        self, tenant: str, key: str, first: int, events: Sequence[bytes]
    ) -> Sequence[bytes]:
        aad = _aad(b"event", tenant, key)
        return [self._seal(data, b"%s %d" % (aad, first + n)) for n, data in enumerate(events)]

    def response_in(
        self, tenant: str, key: str, status: int, headers: bytes, body: bytes, stream: bool
    ) -> StoredResponse:
        if headers == MAGIC:  # a whole response, headers and body in one value
            if body[:4] != MAGIC:
                raise _unreadable(key, "is damaged (its body is not an encrypted value)")
            whole = self._open(body, _aad(b"response", tenant, key), key)
            end = 4 + int.from_bytes(whole[:4], "big")
            return StoredResponse(status, _pairs(whole[4:end]), whole[end:], stream=stream)
        # A stream's headers, or a record from before encryption (both parts plain).
        return StoredResponse(
            status, _pairs(self._open(headers, _aad(b"headers", tenant, key), key)), body, stream
        )

    def events_in(self, tenant: str, key: str, after: int, stored: list[bytes]) -> list[bytes]:
        aad = _aad(b"event", tenant, key)
        return [
            self._open(data, b"%s %d" % (aad, after + n), key)
            for n, data in enumerate(stored, start=1)
        ]
