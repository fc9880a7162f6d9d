"""The simulated provider's settings and the parsers for its flags.

Every parser raises :class:`~payonce.errors.ConfigError` with a one-line message
that names the flag (``--latency: ...``), which the CLI prints and exits 2 with.

Durations are a number and a unit, ``ms`` or ``s`` (``250ms``, ``2s``, ``1.5s``);
a bare ``0`` is also accepted. A bare non-zero number is refused: it is the classic
milliseconds-or-seconds mistake, and guessing would make a run silently wrong.

Token rates (``--token-rate``) are a number of tokens per second, ``50/s`` or
``12.5/s``; ``0`` and ``inf`` mean no pacing (every token at once). A bare non-zero
number is refused for the same reason as a bare duration.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from payonce.errors import ConfigError
from payonce.sim.faults import FaultPlan
from payonce.sim.latency import FixedLatency, LatencyModel, LogNormalLatency
from payonce.sim.profiles import DEFAULT_WIRE, Wire, parse_wire
from payonce.sim.response_store import DEFAULT_STORED_RESPONSES

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_LATENCY",
    "DEFAULT_PORT",
    "DEFAULT_TOKEN_RATE",
    "SimConfig",
    "describe_token_interval",
    "parse_duration",
    "parse_failures",
    "parse_latency",
    "parse_port",
    "parse_rate",
    "parse_seed",
    "parse_token_rate",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100
# The demo default: a median of 1 s with a heavy tail to 10 s at p99. Three times
# faster than a typical hosted model so a demo does not drag, yet about 5% of calls
# outlast a 5 s read timeout, enough to see a timed-out call billed anyway.
DEFAULT_LATENCY = "lognormal:p50=1s,p99=10s"
# Streams only: about what a hosted model streams at, so a demo stream visibly flows.
DEFAULT_TOKEN_RATE = "50/s"  # noqa: S105 (a rate, not a secret)

_DURATION = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)(?P<unit>ms|s)?")


def parse_duration(text: str, *, flag: str) -> float:
    """``250ms`` -> 0.25, ``2s`` -> 2.0, ``0`` -> 0.0 (seconds)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"{flag}: {text!r} is not a duration (examples: 0, 250ms, 2s)")
    value = float(match["number"])
    unit = match["unit"]
    if unit is None:
        if value != 0:
            raise ConfigError(f"{flag}: {text!r} needs a unit, ms or s (for example {text}ms)")
        return 0.0
    seconds = value / 1000 if unit == "ms" else value
    if not math.isfinite(seconds):
        raise ConfigError(f"{flag}: {text!r} is too large")
    return seconds


def parse_latency(text: str, *, flag: str = "--latency") -> LatencyModel:
    """``fixed:<duration>`` or ``lognormal:p50=<duration>,p99=<duration>``."""
    kind, sep, rest = text.strip().partition(":")
    if not sep:
        raise ConfigError(f"{flag}: {text!r} must be fixed:<duration> or lognormal:p50=..,p99=..")
    if kind == "fixed":
        return FixedLatency(parse_duration(rest, flag=flag))
    if kind == "lognormal":
        params = _parse_params(rest, flag=flag, allowed=("p50", "p99"))
        try:
            return LogNormalLatency(params["p50"], params["p99"])
        except ValueError as exc:
            raise ConfigError(f"{flag}: {exc}") from exc
    raise ConfigError(f"{flag}: unknown latency model {kind!r} (use fixed or lognormal)")


def _parse_params(text: str, *, flag: str, allowed: tuple[str, ...]) -> dict[str, float]:
    params: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or name not in allowed:
            raise ConfigError(f"{flag}: expected {'=..,'.join(allowed)}=.., got {item.strip()!r}")
        if name in params:
            raise ConfigError(f"{flag}: {name} given twice")
        params[name] = parse_duration(value, flag=f"{flag} {name}")
    missing = [name for name in allowed if name not in params]
    if missing:
        raise ConfigError(f"{flag}: missing {', '.join(missing)}")
    return params


def parse_rate(text: str, *, flag: str) -> float:
    """A probability between 0 and 1 (``0.05``)."""
    try:
        rate = float(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a number between 0 and 1") from None
    if not 0.0 <= rate <= 1.0:  # also refuses nan
        raise ConfigError(f"{flag}: {text!r} is not between 0 and 1")
    return rate


# A slower stream is certainly a mistake, and would pin a handler for hours.
_MAX_TOKEN_SECONDS = 60.0
# Proxies close idle connections after 60 s or more: a keep-alive must come sooner.
_MAX_KEEP_ALIVE_SECONDS = 60.0
_TOKEN_RATE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)(?P<unit>/s)?")


def parse_token_rate(text: str, *, flag: str = "--token-rate") -> float:
    """``50/s`` -> 0.02, the seconds between two streamed tokens; ``0`` or ``inf`` -> 0.0."""
    value = text.strip().lower()
    if value in ("inf", "inf/s"):
        return 0.0
    match = _TOKEN_RATE.fullmatch(value)
    if match is None:
        raise ConfigError(f"{flag}: {text!r} is not a token rate (examples: 50/s, 0, inf)")
    rate = float(match["number"])
    if rate == 0:
        return 0.0
    if match["unit"] is None:
        raise ConfigError(f"{flag}: {text!r} needs a unit, /s (for example {value}/s)")
    if not math.isfinite(rate):
        raise ConfigError(f"{flag}: {text!r} is too large (use inf for no pacing)")
    if rate < 1 / _MAX_TOKEN_SECONDS:
        raise ConfigError(f"{flag}: {text!r} is slower than one token a minute")
    return 1.0 / rate


def describe_token_interval(seconds: float) -> str:
    """The seconds between tokens in ``--token-rate`` syntax (``50/s``; ``inf`` for none)."""
    if seconds == 0:
        return "inf"
    return f"{1.0 / seconds:g}/s"


def parse_failures(text: str, *, flag: str = "--fail") -> FaultPlan:
    """``500:0.05,429:0.02`` (status:rate pairs); ``none`` or empty for no failures."""
    if text.strip().lower() in ("", "none"):
        return FaultPlan()
    pairs: list[tuple[int, float]] = []
    for item in text.split(","):
        status_text, sep, rate_text = item.strip().partition(":")
        if not sep:
            raise ConfigError(f"{flag}: expected status:rate such as 500:0.05, got {item!r}")
        try:
            status = int(status_text)
        except ValueError:
            raise ConfigError(f"{flag}: {status_text!r} is not an HTTP status") from None
        pairs.append((status, parse_rate(rate_text, flag=f"{flag} {status}")))
    try:
        return FaultPlan(tuple(pairs))
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def parse_port(text: str, *, flag: str = "--port") -> int:
    """A TCP port, 1-65535."""
    try:
        port = int(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"{flag}: {port} is not between 1 and 65535")
    return port


def parse_seed(text: str, *, flag: str = "--seed") -> int:
    """An integer seed for ``random.Random``."""
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not an integer") from None


def _parse_count(text: str, *, flag: str) -> int:
    """A whole number >= 0."""
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a whole number") from None
    if count < 0:
        raise ConfigError(f"{flag}: {count} is below 0")
    return count


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything ``payonce sim`` is told, already parsed and checked.

    ``seed=None`` seeds from the operating system (a different run each time).
    ``ledger_path`` is the CSV billing export, appended to; ``None`` keeps the
    ledger in memory only. ``token_interval`` is the seconds between two streamed
    tokens (0: no pacing); ``die_mid_stream`` the fraction of streams that die;
    ``keep_alive`` the seconds of silence after which a stream sends an SSE
    comment (0: never). ``wire`` is how streams look on the wire
    (:mod:`~payonce.sim.profiles`; ``X-Sim-Wire`` overrides it per request).
    ``stored_responses`` caps the Responses API responses kept for
    ``GET /v1/responses/{id}`` (the oldest are evicted; 0 keeps none).
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    latency: LatencyModel = field(default_factory=lambda: parse_latency(DEFAULT_LATENCY))
    failures: FaultPlan = field(default_factory=FaultPlan)
    drop_after_compute: float = 0.0
    seed: int | None = None
    ledger_path: Path | None = None
    token_interval: float = field(default_factory=lambda: parse_token_rate(DEFAULT_TOKEN_RATE))
    die_mid_stream: float = 0.0
    stored_responses: int = DEFAULT_STORED_RESPONSES
    keep_alive: float = 0.0
    wire: Wire = DEFAULT_WIRE

    def __post_init__(self) -> None:
        if not 0.0 <= self.drop_after_compute <= 1.0:
            raise ConfigError(
                f"--drop-after-compute: {self.drop_after_compute} is not between 0 and 1"
            )
        if not 0.0 <= self.die_mid_stream <= 1.0:
            raise ConfigError(f"--die-mid-stream: {self.die_mid_stream} is not between 0 and 1")
        if not (math.isfinite(self.token_interval) and self.token_interval >= 0):
            raise ConfigError(f"--token-rate: bad token interval {self.token_interval}")
        if self.stored_responses < 0:
            raise ConfigError(f"--stored-responses: {self.stored_responses} is below 0")
        if not 0.0 <= self.keep_alive <= _MAX_KEEP_ALIVE_SECONDS:
            raise ConfigError(f"--keep-alive: {self.keep_alive:g}s is not between 0 and 60s")

    @classmethod
    def from_flags(
        cls,
        *,
        host: str = DEFAULT_HOST,
        port: str = str(DEFAULT_PORT),
        latency: str = DEFAULT_LATENCY,
        fail: str = "",
        drop_after_compute: str = "0",
        seed: str | None = None,
        ledger: str | None = None,
        token_rate: str = DEFAULT_TOKEN_RATE,
        die_mid_stream: str = "0",
        stored_responses: str = str(DEFAULT_STORED_RESPONSES),
        keep_alive: str = "0",
        wire: str = "openai",
    ) -> SimConfig:
        """Parse the CLI's flag strings; raises :class:`ConfigError` on the first bad one."""
        if not host.strip():
            raise ConfigError("--host: must not be empty")
        if ledger is not None and not ledger.strip():
            raise ConfigError("--ledger: must not be empty")
        return cls(
            host=host,
            port=parse_port(port),
            latency=parse_latency(latency),
            failures=parse_failures(fail),
            drop_after_compute=parse_rate(drop_after_compute, flag="--drop-after-compute"),
            seed=None if seed is None else parse_seed(seed),
            ledger_path=None if ledger is None else Path(ledger),
            token_interval=parse_token_rate(token_rate),
            die_mid_stream=parse_rate(die_mid_stream, flag="--die-mid-stream"),
            stored_responses=_parse_count(stored_responses, flag="--stored-responses"),
            keep_alive=parse_duration(keep_alive, flag="--keep-alive"),
            wire=parse_wire(wire, flag="--wire"),
        )
