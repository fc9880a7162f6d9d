"""The stack being simulated, as frozen values, and the parsers of its flags.

A business request goes down these layers (docs/simulate.md draws them)::

    application loop   app_attempts, app_backoff, app_retry_on
      SDK              sdk_retries, sdk_backoff, sdk_retry_on, timeout, connect_timeout
        [proxy]        proxy.timeout, proxy.retries, proxy.retry_on   (above or below payonce)
          [payonce]    one generation per idempotency key
            provider   latency, failure_rate: every generation started is billed

Every parser raises :class:`~payonce.errors.ConfigError` naming the flag, which the
command prints on one line and exits 2 with.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from payonce.config import parse_duration
from payonce.errors import ConfigError

if TYPE_CHECKING:
    from payonce.simulate.latency import Distribution

__all__ = [
    "SDK_BACKOFF",
    "Backoff",
    "ProxyConfig",
    "RetryOn",
    "StackConfig",
    "parse_backoff",
    "parse_rate",
]


class RetryOn(enum.Enum):
    """Which failed attempts a layer retries: a timeout, a 5xx answer, both or neither.

    A connect timeout counts as a timeout (the openai SDK raises ``APITimeoutError``
    for both). A 504 from a proxy that gave up counts as a 5xx.
    """

    TIMEOUT = "timeout"
    SERVER_ERROR = "5xx"
    BOTH = "both"
    NONE = "none"

    @property
    def timeouts(self) -> bool:
        return self in (RetryOn.TIMEOUT, RetryOn.BOTH)

    @property
    def server_errors(self) -> bool:
        return self in (RetryOn.SERVER_ERROR, RetryOn.BOTH)


@dataclass(frozen=True, slots=True)
class Backoff:
    """The wait before retry ``n`` (0 for the first): ``min(initial * multiplier**n, maximum)``
    times ``(1 - jitter * U)``, ``U`` uniform in [0, 1).

    :data:`SDK_BACKOFF` is the official openai and anthropic SDKs' formula
    (``_calculate_retry_timeout``): 0.5 s doubling up to 8 s, less up to 25%.
    """

    initial: float
    maximum: float
    jitter: float = 0.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial) and self.initial >= 0):
            raise ConfigError(f"backoff: initial must be >= 0, got {self.initial}")
        if not (math.isfinite(self.maximum) and self.maximum >= 0):
            raise ConfigError(f"backoff: max must be >= 0, got {self.maximum}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigError(f"backoff: jitter must be between 0 and 1, got {self.jitter}")

    def ceiling(self, retry: int) -> float:
        """The wait before retry ``retry`` without jitter."""
        return min(self.initial * self.multiplier**retry, self.maximum)

    def describe(self) -> str:
        if self == SDK_BACKOFF:
            return "sdk"
        if self.maximum == 0:
            return "none"
        if self.multiplier == 1 and self.jitter == 0:
            return f"fixed:{self.initial:g}s"
        return f"exp:initial={self.initial:g}s,max={self.maximum:g}s,jitter={self.jitter:g}"


SDK_BACKOFF = Backoff(initial=0.5, maximum=8.0, jitter=0.25)
NO_BACKOFF = Backoff(initial=0.0, maximum=0.0)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """A retrying proxy (nginx ``proxy_next_upstream timeout``, ``proxy_next_upstream_tries``).

    Each try waits ``timeout`` for the upstream's answer; a try that gets none is
    abandoned (its generation still runs and bills) and, ``retries`` times at most,
    sent again. After its last try times out the proxy answers 504.
    """

    timeout: float
    retries: int = 0
    retry_on: RetryOn = RetryOn.TIMEOUT

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(f"--proxy-timeout: must be > 0, got {self.timeout:g}")
        if self.retries < 0:
            raise ConfigError(f"--proxy-retries: must be >= 0, got {self.retries}")


@dataclass(frozen=True, slots=True)
class StackConfig:
    """One configuration of the stack; the defaults are the openai SDK's own.

    ``timeout`` is the SDK's read timeout: a non-streamed answer arrives whole, so
    an attempt times out when its answer takes longer. ``connect_failure_rate`` is
    the share of attempts whose connection cannot be made; each costs
    ``connect_timeout`` of waiting and nothing on the bill. ``deadline`` is the
    application's overall budget per business request (``None``: no deadline).
    With ``payonce``, the gateway sits above the provider and the proxy, if any,
    above the gateway, unless ``proxy_below_payonce``.
    """

    latency: Distribution
    timeout: float = 600.0
    connect_timeout: float = 5.0
    connect_failure_rate: float = 0.0
    app_attempts: int = 1
    app_backoff: Backoff = NO_BACKOFF
    app_retry_on: RetryOn = RetryOn.TIMEOUT
    sdk_retries: int = 2
    sdk_backoff: Backoff = SDK_BACKOFF
    sdk_retry_on: RetryOn = RetryOn.BOTH
    proxy: ProxyConfig | None = None
    payonce: bool = False
    proxy_below_payonce: bool = False
    failure_rate: float = 0.0
    deadline: float | None = None

    def __post_init__(self) -> None:
        for flag, value in (
            ("--timeout", self.timeout),
            ("--connect-timeout", self.connect_timeout),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{flag}: must be > 0")
        if self.app_attempts < 1:
            raise ConfigError(f"--app-attempts: must be >= 1, got {self.app_attempts}")
        if self.sdk_retries < 0:
            raise ConfigError(f"--sdk-retries: must be >= 0, got {self.sdk_retries}")
        for flag, rate in (
            ("--fail", self.failure_rate),
            ("--connect-fail", self.connect_failure_rate),
        ):
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(f"{flag}: must be between 0 and 1, got {rate:g}")
        if self.deadline is not None and not (math.isfinite(self.deadline) and self.deadline > 0):
            raise ConfigError("--deadline: must be > 0")

    @property
    def max_attempts(self) -> int:
        """SDK attempts one business request can send at most."""
        return self.app_attempts * (self.sdk_retries + 1)

    def describe(self, *, payonce: bool | None = None) -> str:
        """The layers from the top, in one line (``payonce`` overrides :attr:`payonce`)."""
        with_payonce = self.payonce if payonce is None else payonce
        layers = []
        if self.app_attempts > 1:
            layers.append(
                f"app {self.app_attempts} attempts (backoff {self.app_backoff.describe()},"
                f" on {self.app_retry_on.value})"
            )
        layers.append(
            f"SDK {self.sdk_retries + 1} attempts (timeout {_seconds(self.timeout)},"
            f" backoff {self.sdk_backoff.describe()}, on {self.sdk_retry_on.value})"
        )
        proxy = None
        if self.proxy is not None:
            proxy = (
                f"proxy {self.proxy.retries + 1} tries (timeout {_seconds(self.proxy.timeout)},"
                f" on {self.proxy.retry_on.value})"
            )
        if proxy and not (with_payonce and self.proxy_below_payonce):
            layers.append(proxy)
        if with_payonce:
            layers.append("payonce")
            if proxy and self.proxy_below_payonce:
                layers.append(proxy)
        provider = f"provider {self.latency.describe()}"
        if self.failure_rate:
            provider += f", 5xx {self.failure_rate:.2%}"
        layers.append(provider)
        line = " → ".join(layers)
        if self.deadline is not None:
            line += f"; deadline {_seconds(self.deadline)}"
        if self.connect_failure_rate:
            line += (
                f"; {self.connect_failure_rate:.2%} connect failures"
                f" ({_seconds(self.connect_timeout)} each)"
            )
        return line


def _seconds(value: float) -> str:
    return f"{value * 1000:g}ms" if value < 1 else f"{value:g}s"


_BACKOFF_PARAM = re.compile(r"\s*(initial|max|jitter|multiplier)\s*=\s*([^,]+)\s*")


def parse_backoff(text: str, *, flag: str) -> Backoff:
    """``sdk``, ``none``, a duration (``300ms``: the same wait every time), ``fixed:300ms``
    or ``exp:initial=0.5s,max=8s,jitter=0.25[,multiplier=2]``."""
    value = text.strip()
    if value == "sdk":
        return SDK_BACKOFF
    if value in ("none", "0"):
        return NO_BACKOFF
    kind, sep, rest = value.partition(":")
    if not sep:
        seconds = parse_duration(value, flag)
        return Backoff(initial=seconds, maximum=seconds, multiplier=1.0)
    if kind == "fixed":
        seconds = parse_duration(rest, flag)
        return Backoff(initial=seconds, maximum=seconds, multiplier=1.0)
    if kind != "exp":
        raise ConfigError(
            f"{flag}: {text!r} must be sdk, none, a duration, fixed:<duration> or"
            " exp:initial=..,max=..,jitter=.."
        )
    params: dict[str, str] = {}
    for item in rest.split(","):
        match = _BACKOFF_PARAM.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"{flag}: expected initial=, max=, jitter= or multiplier=, got {item!r}"
            )
        params[match[1]] = match[2].strip()
    try:
        initial = parse_duration(params.get("initial", "0.5s"), f"{flag} initial")
        maximum = parse_duration(params.get("max", "8s"), f"{flag} max")
        jitter = _number(params.get("jitter", "0"), flag=f"{flag} jitter")
        multiplier = _number(params.get("multiplier", "2"), flag=f"{flag} multiplier")
        return Backoff(initial=initial, maximum=maximum, jitter=jitter, multiplier=multiplier)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(flag) else f"{flag}: {message}") from None


def parse_rate(text: str, *, flag: str) -> float:
    """A fraction between 0 and 1 (``0.05``), or a percentage (``5%``)."""
    value = text.strip()
    scale = 1.0
    if value.endswith("%"):
        value, scale = value[:-1], 0.01
    rate = _number(value, flag=flag) * scale
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"{flag}: {text!r} is not between 0 and 1")
    return rate


def _number(text: str, *, flag: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{flag}: {text!r} must be a finite number >= 0")
    return number
