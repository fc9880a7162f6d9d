"""The catalogue of rule codes, and ``--select``/``--ignore`` resolution.

Codes are stable: a code is never reused for another rule. Families:

====== ==========================================================
PO1xx  stacked retry layers (each layer multiplies billed calls)
PO2xx  retried calls without a stable idempotency key
PO3xx  timeouts that give up on calls the provider still bills
PO4xx  timeout handlers that re-send blindly
PO5xx  proxy configuration (nginx, Envoy, LiteLLM proxy)
PO9xx  files the linter could not read
====== ==========================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from payonce.errors import ConfigError

__all__ = ["RULES", "Level", "Rule", "RuleSelection"]

DOCS_URL = "https://github.com/payonce/payonce/blob/main/docs/lint-rules.md"


class Level(Enum):
    """SARIF ``level`` of a rule's results."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: its code, a short kebab-case name and a one-line summary."""

    code: str
    name: str
    summary: str
    level: Level

    @property
    def help_uri(self) -> str:
        return f"{DOCS_URL}#{self.code.lower()}"


_ALL = (
    Rule(
        "PO101",
        "sdk-retries-under-app-retries",
        "LLM SDK client keeps its own retries (max_retries not 0) inside code that retries it",
        Level.ERROR,
    ),
    Rule(
        "PO102",
        "stacked-app-retries",
        "More than one application retry layer around the same LLM call",
        Level.ERROR,
    ),
    Rule(
        "PO201",
        "app-retry-without-key",
        "LLM generation call retried by application code sends no idempotency key that"
        " survives the retry",
        Level.ERROR,
    ),
    Rule(
        "PO202",
        "sdk-retry-without-key",
        "LLM generation call retried by the SDK (max_retries not 0) sends no idempotency key",
        Level.WARNING,
    ),
    Rule(
        "PO203",
        "key-minted-per-attempt",
        "Idempotency key generated inside the retried block: every attempt gets a new key",
        Level.ERROR,
    ),
    Rule(
        "PO301",
        "short-read-timeout",
        "Read timeout under 30 s on an LLM call: gives up on generations the provider"
        " finishes and bills",
        Level.WARNING,
    ),
    Rule(
        "PO302",
        "timeout-not-split",
        "Timeout given as one number: connect and read timeouts are not separated",
        Level.WARNING,
    ),
    Rule(
        "PO401",
        "timeout-handler-resends",
        "Timeout caught and the call re-sent without an idempotency key or a status check",
        Level.ERROR,
    ),
    Rule(
        "PO501",
        "nginx-next-upstream-llm",
        "nginx proxy_next_upstream with timeout or non_idempotent on an LLM route",
        Level.ERROR,
    ),
    Rule(
        "PO502",
        "envoy-retry-llm",
        "Envoy retry_policy retrying 5xx, resets or per-try timeouts on an LLM route",
        Level.ERROR,
    ),
    Rule(
        "PO503",
        "litellm-proxy-retries",
        "LiteLLM proxy num_retries on top of the callers' SDK retries",
        Level.ERROR,
    ),
    Rule(
        "PO901",
        "python-syntax-error",
        "Python file could not be parsed; it was not checked",
        Level.WARNING,
    ),
    Rule(
        "PO902",
        "config-syntax-error",
        "Proxy configuration file could not be parsed; it was not checked",
        Level.WARNING,
    ),
)

RULES: dict[str, Rule] = {rule.code: rule for rule in _ALL}


@dataclass(frozen=True, slots=True)
class RuleSelection:
    """Which codes are reported, from ``--select`` and ``--ignore`` (codes or prefixes).

    ``--select PO1,PO201`` keeps the PO1xx family and PO201; ``--ignore`` then
    removes codes from that set. The empty selection means every rule.
    """

    codes: frozenset[str]

    @classmethod
    def build(cls, select: Iterable[str] = (), ignore: Iterable[str] = ()) -> RuleSelection:
        """Resolve prefixes to codes; an entry that matches no code is a :class:`ConfigError`."""
        chosen = _expand(select, "--select") if _entries(select) else set(RULES)
        return cls(frozenset(chosen - _expand(ignore, "--ignore")))

    @classmethod
    def everything(cls) -> RuleSelection:
        return cls(frozenset(RULES))

    def __contains__(self, code: object) -> bool:
        return code in self.codes


def _entries(values: Iterable[str]) -> list[str]:
    # Flags may repeat and may hold comma-separated lists: --select PO1,PO2 --select PO4.
    return [part.strip().upper() for value in values for part in value.split(",") if part.strip()]


def _expand(values: Iterable[str], flag: str) -> set[str]:
    codes: set[str] = set()
    for entry in _entries(values):
        matched = {code for code in RULES if code.startswith(entry)}
        if not matched:
            raise ConfigError(f"{flag}: unknown rule code or prefix {entry!r}")
        codes |= matched
    return codes
