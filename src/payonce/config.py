"""Settings, read in one place.

CLI flags win over ``PAYONCE_*`` variables, which win over a TOML file, then defaults.

Values are parsed here and checked in ``__post_init__``, so a bad value fails at
start-up with one line naming the flag, never later with a traceback.
"""

from __future__ import annotations

import re
import ssl
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from payonce.errors import ConfigError

__all__ = ["GatewaySettings", "load_toml", "parse_duration", "parse_rate", "parse_size"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an RFC 9110 token
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(b|kb|kib|mb|mib|gb|gib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3,
}  # fmt: skip


def parse_duration(value: str | float, name: str) -> float:
    """``"30s"``, ``"500ms"``, ``"24h"``, ``"2d"`` or a number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ConfigError(f"{name}: {value!r} is not a duration (e.g. 500ms, 30s, 5m, 24h)")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds < 0:
        raise ConfigError(f"{name}: must not be negative")
    return seconds


def parse_rate(value: str, name: str) -> tuple[int, float]:
    """``"600/m"``, ``"10/s"``, ``"1000/1h"``: a count per period, as (count, seconds)."""
    count, slash, period = str(value).partition("/")
    try:
        number = int(count.strip())
    except ValueError:
        number = -1
    if not slash or number < 1:
        raise ConfigError(f"{name}: {value!r} is not a rate (e.g. 600/m, 10/s, 1000/1h)")
    unit = period.strip()
    seconds = parse_duration("1" + unit if unit in _DURATION_UNITS else unit, name)
    if seconds <= 0:
        raise ConfigError(f"{name}: the period of {value!r} must be positive")
    return number, seconds


def parse_size(value: str | int, name: str, *, allow_zero: bool = False) -> int:
    """``"10MiB"``, ``"512KB"`` or a number of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.match(str(value))
        if match is None:
            raise ConfigError(f"{name}: {value!r} is not a size (e.g. 10MiB, 512KB, 1048576)")
        size = int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()])
    if size < 0 or (size == 0 and not allow_zero):
        raise ConfigError(f"{name}: must be positive")
    return size


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """Everything ``payonce serve`` can be told. See docs/gateway.md, "Flags"."""

    host: str = "127.0.0.1"
    port: int = 8080
    upstream: str = "sim"
    store: str = "sqlite:///./payonce.db"
    require_key: bool = False
    # X-Request-ID is often set per attempt by proxies, so it is a key only when asked.
    key_from_request_id: bool = False
    tenant_header: str | None = None
    # Headers carrying a credential, beyond the known ones (payonce/credentials.py).
    credential_header: tuple[str, ...] = ()
    # Headers naming a request's business scenario, beyond X-Payonce-Scenario
    # (observe/scenarios.py), and the scenarios the metrics label ("other" else).
    scenario_header: tuple[str, ...] = ()
    scenarios: tuple[str, ...] = ()
    # The scenario of a credential's requests that name none: tenant id (payonce
    # tenant-id) -> scenario; "TENANT=NAME" strings from the flag, a table in TOML.
    credential_scenario: tuple[str, ...] | dict[str, str] = ()
    # Refuse keyed requests without a credential (401) instead of sharing the
    # anonymous tenant among them.
    require_credential: bool = False
    wait_timeout: float = 60.0
    lease: float = 30.0
    # At SIGTERM: answer /_payonce/health/ready 503 and keep serving this long
    # before the listener closes and the drain begins (docs/deploy.md, probes).
    shutdown_delay: float = 0.0
    ttl: float = 86400.0
    max_body: int = 10 * 1024 * 1024
    # What a client may send before the app sees a request, and how slowly
    # (gateway/protocol.py): 431 past the head limits, 408 past the timeouts.
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 30.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    replay_cache: int = 64 * 1024 * 1024
    # Per-tenant limits (docs/gateway.md, "Limits per tenant"); None: no limit.
    max_inflight_per_tenant: int | None = None
    max_new_keys_per_tenant: str | None = None  # a rate, "600/m" (parse_rate)
    max_stored_body: int | None = None  # larger responses are relayed, not stored
    on_disconnect: str = "cancel"
    # A keyed stream every client left: read it to the end for the retry, or stop paying.
    on_stream_disconnect: str = "finish"
    # Ask OpenAI-style streams for their usage chunk (and strip it) so cost is known.
    inject_stream_usage: bool = True
    # Retries an SDK declares (x-stainless-retry-count) answered from their first
    # attempt's run without a key (gateway/sdk_retries.py), and how long at most an
    # answer waits for them.
    match_sdk_retries: bool = True
    sdk_retry_window: float = 600.0
    # Opt-in: any request without a key identical to one running or answered within
    # this window is its duplicate (gateway/sdk_retries.py); None: off.
    dedupe_identical: float | None = None
    connect_timeout: float = 5.0
    upstream_timeout: float = 600.0
    connect_retries: int = 2
    call_log: str | None = None  # a file path, or "-" for stdout
    call_log_max_bytes: int = 100 * 1024 * 1024
    call_log_backups: int = 5
    prices: str | None = None  # a TOML or JSON file adding to the price table
    metrics: bool = True
    metrics_token: str | None = None
    otel: bool = True  # spans through opentelemetry-api, when it is installed
    sim_port: int = 8100
    log_level: str = "info"
    # Worker processes on one host, sharing the port and the store (docs/gateway.md, "Flags").
    workers: int = 1
    # A keyed request while the store cannot answer: 503 ("closed") or forwarded
    # unprotected ("open"): availability over the promise of one run per key.
    on_store_failure: str = "closed"
    # PostgreSQL: apply the schema at start-up (else only check it: payonce migrate).
    migrate: bool = True
    # Encryption at rest (docs/gateway.md, "Encryption at rest"): the keys
    # themselves (PAYONCE_ENCRYPTION_KEY only: never a flag, never printed) or
    # a file of them.
    encryption_key: str | None = field(default=None, repr=False)
    encryption_key_file: str | None = None
    # HTTPS (docs/gateway.md, "TLS"): PEM certificate chain and its private key.
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port: {self.port} is not a TCP port (0-65535)")
        if not 1 <= self.sim_port <= 65535:
            raise ConfigError(f"--sim-port: {self.sim_port} is not a TCP port (1-65535)")
        if self.on_disconnect not in ("cancel", "continue"):
            raise ConfigError(f"--on-disconnect: {self.on_disconnect!r} is not cancel or continue")
        if self.on_stream_disconnect not in ("finish", "cancel"):
            raise ConfigError(
                f"--on-stream-disconnect: {self.on_stream_disconnect!r} is not finish or cancel"
            )
        if self.lease < 1:
            raise ConfigError("--lease: must be at least 1s (it is renewed every third of it)")
        if self.shutdown_delay < 0:
            raise ConfigError("--shutdown-delay: must not be negative")
        if self.ttl < self.lease:
            raise ConfigError("--ttl: must be at least as long as --lease")
        if self.wait_timeout <= 0:
            raise ConfigError("--wait-timeout: must be positive")
        if self.sdk_retry_window < 1:
            raise ConfigError("--sdk-retry-window: must be at least 1s")
        if self.dedupe_identical is not None and self.dedupe_identical < 1:
            raise ConfigError("--dedupe-identical: must be at least 1s")
        if self.connect_timeout <= 0 or self.upstream_timeout <= 0:
            raise ConfigError("--connect-timeout and --upstream-timeout must be positive")
        if not 1024 <= self.max_header_bytes <= 16 * 1024 * 1024:
            raise ConfigError("--max-header-bytes: must be between 1KiB and 16MiB")
        if not 1 <= self.max_headers <= 10000:
            raise ConfigError("--max-headers: must be between 1 and 10000")
        for flag, seconds in (
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
            ("--keep-alive-timeout", self.keep_alive_timeout),
        ):
            if seconds <= 0:
                raise ConfigError(f"{flag}: must be positive")
        if not 0 <= self.connect_retries <= 10:
            raise ConfigError("--connect-retries: must be between 0 and 10")
        if not 0 <= self.call_log_backups <= 100:
            raise ConfigError("--call-log-backups: must be between 0 and 100")
        if self.log_level not in ("critical", "error", "warning", "info", "debug"):
            raise ConfigError(
                f"--log-level: {self.log_level!r} is not one of"
                " critical, error, warning, info, debug"
            )
        if self.tenant_header is not None and not _HEADER_NAME.fullmatch(self.tenant_header):
            raise ConfigError(f"--tenant-header: {self.tenant_header!r} is not a header name")
        # One string (a TOML value, an API caller) or several names, each of which
        # may list more separated by commas or whitespace (PAYONCE_CREDENTIAL_HEADER).
        raw = cast("tuple[str, ...] | str", self.credential_header)
        names = tuple(
            name
            for item in ((raw,) if isinstance(raw, str) else raw)
            for name in re.split(r"[\s,]+", str(item))
            if name
        )
        for name in names:
            if not _HEADER_NAME.fullmatch(name):
                raise ConfigError(f"--credential-header: {name!r} is not a header name")
        object.__setattr__(
            self, "credential_header", tuple(dict.fromkeys(n.lower() for n in names))
        )
        if self.credential_header and self.tenant_header is not None:
            raise ConfigError(
                "--credential-header: the tenant comes from --tenant-header alone, so"
                " credential headers would be ignored; set one of the two"
            )
        object.__setattr__(
            self, "scenario_header", _names(self.scenario_header, "--scenario-header")
        )
        for name in self.scenario_header:
            if not _HEADER_NAME.fullmatch(name):
                raise ConfigError(f"--scenario-header: {name!r} is not a header name")
        object.__setattr__(self, "scenarios", _scenario_list(self.scenarios))
        object.__setattr__(
            self, "credential_scenario", _credential_scenarios(self.credential_scenario)
        )
        if not 1 <= self.workers <= 64:
            raise ConfigError(f"--workers: {self.workers} is not between 1 and 64")
        if self.workers > 1 and self.store == "memory://":
            raise ConfigError(
                "--workers: memory:// lives in one process's memory, so workers could not"
                " see each other's keys; use sqlite:///path.db or redis://host:port/db"
            )
        if self.max_inflight_per_tenant is not None and self.max_inflight_per_tenant < 1:
            raise ConfigError("--max-inflight-per-tenant: must be at least 1")
        if self.max_new_keys_per_tenant is not None:
            parse_rate(self.max_new_keys_per_tenant, "--max-new-keys-per-tenant")
        if self.max_stored_body is not None and self.max_stored_body < 1:
            raise ConfigError("--max-stored-body: must be positive")
        if self.on_store_failure not in ("closed", "open"):
            raise ConfigError(
                f"--on-store-failure: {self.on_store_failure!r} is not closed or open"
            )
        if self.encryption_key is not None or self.encryption_key_file is not None:
            from payonce.store.sealing import load_keys  # only then: it checks the keys

            load_keys(self.encryption_key, self.encryption_key_file)
        if self.tls_cert is not None or self.tls_key is not None:
            _check_tls(self.tls_cert, self.tls_key)


def _names(raw: object, flag: str) -> tuple[str, ...]:
    """Header names: one string (TOML, an env var: commas or spaces) or several, lowered."""
    items = (raw,) if isinstance(raw, str) else cast("tuple[str, ...]", raw)
    return tuple(
        dict.fromkeys(
            name.lower() for item in items for name in re.split(r"[\s,]+", str(item)) if name
        )
    )


# Scenario names the metrics may label: at most this many (each adds a series per endpoint).
_MAX_SCENARIOS = 100


def _scenario_list(raw: object) -> tuple[str, ...]:
    """``--scenarios a,b,c``: one string or several, each possibly comma-separated."""
    items = (raw,) if isinstance(raw, str) else cast("tuple[str, ...]", raw)
    names = tuple(
        dict.fromkeys(
            name.strip() for item in items for name in str(item).split(",") if name.strip()
        )
    )
    if len(names) > _MAX_SCENARIOS:
        raise ConfigError(
            f"--scenarios: {len(names)} scenarios; at most {_MAX_SCENARIOS} (each is a metrics"
            " series per endpoint: the call log keeps every scenario anyway)"
        )
    for name in names:
        if name in ("other", "none") or len(name) > 100:
            raise ConfigError(f"--scenarios: {name!r} cannot be a scenario label")
    return names


def _credential_scenarios(raw: object) -> dict[str, str]:
    """``--credential-scenario TENANT=NAME`` (repeatable) or a TOML table, as a dict."""
    if isinstance(raw, dict):
        items = [(str(k), str(v)) for k, v in raw.items()]
    else:
        items = []
        for item in (raw,) if isinstance(raw, str) else cast("tuple[str, ...]", raw):
            for part in str(item).split(","):
                if not part.strip():
                    continue
                tenant, sep, name = part.partition("=")
                if not sep:
                    raise ConfigError(
                        f"--credential-scenario: expected TENANT=NAME (TENANT from payonce"
                        f" tenant-id), got {part.strip()!r}"
                    )
                items.append((tenant, name))
    found: dict[str, str] = {}
    for tenant, name in items:
        tenant, name = tenant.strip(), name.strip()
        if not tenant or not name or not name.isprintable():
            raise ConfigError(f"--credential-scenario: {tenant!r}={name!r} is not TENANT=NAME")
        found[tenant] = name
    return found


class _EncryptedKey(Exception):
    """The TLS key asked for a pass phrase (raised by the password callback)."""


def _no_pass_phrase() -> bytes:
    raise _EncryptedKey


def _check_tls(cert: str | None, key: str | None) -> None:
    """Load the certificate and key once, so a bad pair fails at start-up in one line."""
    if cert is None or key is None:
        raise ConfigError("--tls-cert and --tls-key: give both (PEM files), or neither")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not Path(path).is_file():
            raise ConfigError(f"{flag}: {path} is not a file")
    try:
        # An encrypted key makes OpenSSL ask for its pass phrase, on the terminal or
        # on standard input, unless a password callback answers: this one refuses, so
        # start-up never waits for a person (a service has nobody at its terminal).
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, _no_pass_phrase)
    except _EncryptedKey:
        raise ConfigError(
            f"--tls-key: {key} is encrypted (it needs a pass phrase); give the gateway"
            f" an unencrypted PEM private key, e.g. openssl pkey -in {key} -out <file>,"
            " kept readable by the gateway's user only"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"--tls-cert/--tls-key: cannot use {cert} with {key}: {exc}"
            " (PEM certificate chain and its unencrypted private key)"
        ) from None


SETTING_NAMES = frozenset(field.name for field in fields(GatewaySettings))


def load_toml(path: str) -> dict[str, Any]:
    """Read a ``--config`` file: a flat TOML table (or ``[serve]``) of setting names.

    Names may use dashes or underscores (``wait-timeout`` or ``wait_timeout``).
    """
    try:
        with Path(path).open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"--config: {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config: {path} is not valid TOML: {exc}") from None
    table = document.get("serve", document)
    if not isinstance(table, dict):
        raise ConfigError(f"--config: [serve] in {path} must be a table")
    values: dict[str, Any] = {}
    for raw_name, value in table.items():
        name = raw_name.replace("-", "_")
        if name == "encryption_key":
            # Config files get copied, committed and shown; keys belong in a file
            # of their own that only the gateway's user can read.
            raise ConfigError(
                f"--config: {raw_name!r} in {path}: put the keys in a file of their own"
                " (mode 0600) and name it with encryption-key-file"
            )
        if name not in SETTING_NAMES:
            raise ConfigError(f"--config: unknown setting {raw_name!r} in {path}")
        values[name] = value
    return values
