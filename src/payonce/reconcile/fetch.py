"""``payonce reconcile --fetch``: pull the providers' admin usage and cost reports.

=========  ==============================================  ====================================
provider   report (``GET``)                                query besides the range and ``limit``
=========  ==============================================  ====================================
openai     ``/v1/organization/usage/completions``          ``bucket_width``, ``group_by=model``,
                                                           ``group_by=api_key_id``,
                                                           ``group_by=project_id``
openai     ``/v1/organization/costs``                      ``bucket_width=1d``,
                                                           ``group_by=line_item``,
                                                           ``group_by=project_id``
anthropic  ``/v1/organizations/usage_report/messages``     ``bucket_width``, ``group_by[]=model``,
                                                           ``group_by[]=api_key_id``,
                                                           ``group_by[]=workspace_id``
anthropic  ``/v1/organizations/cost_report``               ``bucket_width=1d``,
                                                           ``group_by[]=description``,
                                                           ``group_by[]=workspace_id``
=========  ==============================================  ====================================

The array parameters are spelled as each provider documents them: OpenAI's OpenAPI
spec declares ``group_by`` a query array with the default style (form, exploded:
the name repeated), Anthropic's reference writes ``group_by[]``. OpenAI takes
``start_time``/``end_time`` in Unix seconds, Anthropic ``starting_at``/``ending_at``
in RFC 3339. ``limit`` is the most buckets a page may hold for the width (1,440
minutes, 168 hours, 31 days; OpenAI's costs 180 days), so a long range takes few
pages; ``next_page`` is passed back as ``page`` until ``has_more`` is false.

Each page is written to ``<provider>-usage.jsonl`` / ``<provider>-costs.jsonl`` as
the provider sent it, on one line: a JSON text holds no raw line break inside a
string, so deleting the line breaks of a pretty-printed page changes no value and
no token. The file appears only once every page is in (``.partial`` until then).

**Retries** (docs/client.md, "What each failure proves"): 408, 429, 5xx and
connection failures are tried again, at most ``FetchRetry.attempts`` times per
page and never past ``FetchRetry.deadline`` seconds after the page's first try;
the wait before retry *n* is full jitter raised to what the provider asked for::

    wait(n) = max(retry_after, uniform(0, min(backoff_max, backoff_initial * 2 ** (n - 1))))

with ``retry_after`` from ``retry-after-ms``, else ``Retry-After`` (seconds or an
HTTP date). A wait that would end past the deadline is not taken. 401 and 403 are
a :class:`~payonce.errors.ConfigError` naming the environment variable the key came
from (exit code 2); any other 4xx, a redirect (never followed: it would carry the
key elsewhere) or an answer that is not a page is a :class:`~payonce.errors.PayonceError`.

**The key** goes into one request header and nowhere else: every message made from
a provider's answer has it replaced by ``[redacted]``, errors are raised without the
HTTP exception they came from, and nothing is logged.
"""

from __future__ import annotations

import datetime as dt
import http.client
import ipaddress
import json
import math
import os
import random
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from payonce import __version__
from payonce.clock import Clock, SystemClock
from payonce.errors import ConfigError, PayonceError
from payonce.retry_after import retry_after_seconds

__all__ = [
    "ADMIN_KEY_ENV",
    "BUCKET_WIDTHS",
    "DEFAULT_BASE_URLS",
    "PROVIDERS",
    "FetchRetry",
    "admin_key_from_env",
    "check_base_url",
    "fetch_reports",
    "parse_moment",
]

PROVIDERS = ("openai", "anthropic")
BUCKET_WIDTHS = ("1m", "1h", "1d")
ADMIN_KEY_ENV: Mapping[str, str] = {
    "openai": "OPENAI_ADMIN_KEY",
    "anthropic": "ANTHROPIC_ADMIN_KEY",
}
DEFAULT_BASE_URLS: Mapping[str, str] = {
    "openai": "https://api.openai.com",
    "anthropic": "https://api.anthropic.com",
}
ANTHROPIC_VERSION = "2023-06-01"

# The most buckets per page of the usage reports, as both providers document them.
_USAGE_LIMITS: Mapping[str, int] = {"1m": 1440, "1h": 168, "1d": 31}
_RETRY_STATUSES = frozenset({408, 429})
_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space: anything else breaks a header
_MESSAGE_CHARS = 300


# ------------------------------------------------------------------ the reports


@dataclass(frozen=True, slots=True)
class _Report:
    kind: str  # "usage" or "costs": the file is <provider>-<kind>.jsonl
    path: str
    group_by: tuple[str, ...]
    limits: Mapping[str, int]  # bucket width -> most buckets per page; one key: fixed width


@dataclass(frozen=True, slots=True)
class _Provider:
    name: str
    key_env: str
    group_param: str
    start_param: str
    end_param: str
    rfc3339: bool
    reports: tuple[_Report, ...]

    def moment(self, seconds: int) -> str:
        if not self.rfc3339:
            return str(seconds)
        return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def headers(self, key: str) -> dict[str, str]:
        common = {"Accept": "application/json", "User-Agent": f"payonce/{__version__}"}
        if self.name == "openai":
            return {**common, "Authorization": f"Bearer {key}"}
        return {**common, "x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}


_PROVIDERS: Mapping[str, _Provider] = {
    "openai": _Provider(
        name="openai",
        key_env=ADMIN_KEY_ENV["openai"],
        group_param="group_by",
        start_param="start_time",
        end_param="end_time",
        rfc3339=False,
        reports=(
            _Report(
                "usage",
                "/v1/organization/usage/completions",
                ("model", "api_key_id", "project_id"),
                _USAGE_LIMITS,
            ),
            _Report("costs", "/v1/organization/costs", ("line_item", "project_id"), {"1d": 180}),
        ),
    ),
    "anthropic": _Provider(
        name="anthropic",
        key_env=ADMIN_KEY_ENV["anthropic"],
        group_param="group_by[]",
        start_param="starting_at",
        end_param="ending_at",
        rfc3339=True,
        reports=(
            _Report(
                "usage",
                "/v1/organizations/usage_report/messages",
                ("model", "api_key_id", "workspace_id"),
                _USAGE_LIMITS,
            ),
            _Report(
                "costs",
                "/v1/organizations/cost_report",
                ("description", "workspace_id"),
                {"1d": 31},
            ),
        ),
    ),
}


# ------------------------------------------------------------------ retry policy


@dataclass(frozen=True, slots=True)
class FetchRetry:
    """How each page request is retried: bounded by tries *and* by time.

    ``attempts`` tries at most, none starting after ``deadline`` seconds from the
    page's first try; ``timeout`` bounds each try's connect and each read.
    """

    attempts: int = 6
    deadline: float = 300.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"FetchRetry.attempts must be at least 1, got {self.attempts}")
        for name in ("deadline", "timeout", "backoff_initial", "backoff_max"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ConfigError(f"FetchRetry.{name} must be 0 or more, got {value}")

    def backoff(self, retry: int, rng: random.Random) -> float:
        """The jittered wait before retry number ``retry`` (1-based), without ``Retry-After``."""
        return rng.uniform(0.0, min(self.backoff_max, self.backoff_initial * 2.0 ** (retry - 1)))


# ------------------------------------------------------------------ arguments


def admin_key_from_env(provider: str, environ: Mapping[str, str] | None = None) -> str:
    """The admin key for ``provider`` from its environment variable (one-line error if unset)."""
    name = _provider(provider).key_env
    key = (os.environ if environ is None else environ).get(name, "").strip()
    if not key:
        raise ConfigError(
            f"{name} is not set: --fetch {provider} reads the admin key from it, never from"
            " a flag (docs/reconcile.md, 'Fetching the reports')"
        )
    return key


def parse_moment(flag: str, text: str) -> dt.datetime:
    """An ISO 8601 date or date and time, in UTC (a value without an offset is UTC)."""
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"{flag}: expected an ISO date or date and time (2026-11-01, 2026-11-01T06:00Z),"
            f" got {text!r}"
        ) from None
    return _utc(moment)


def check_base_url(url: str) -> str:
    """``url`` without a trailing ``/`` or ``/v1``; https, or http to a loopback host only."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"--fetch-url: expected an http:// or https:// URL, got {url!r}")
    if parsed.query or parsed.fragment or parsed.username or parsed.password:
        raise ConfigError(
            f"--fetch-url: expected a base URL without credentials, query or fragment, got {url!r}"
        )
    if parsed.scheme == "http" and not _loopback(parsed.hostname):
        raise ConfigError(
            f"--fetch-url: {url} would carry the admin key unencrypted; use https:// (plain"
            " http is accepted for localhost, 127.0.0.1 and ::1, where payonce sim runs)"
        )
    path = parsed.path.rstrip("/")
    path = path.removesuffix("/v1")  # the SDKs' base URL form
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _provider(name: str) -> _Provider:
    try:
        return _PROVIDERS[name]
    except KeyError:
        raise ConfigError(
            f"--fetch: expected one of {', '.join(PROVIDERS)}, got {name!r}"
        ) from None


def _utc(moment: dt.datetime) -> dt.datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def _checked_key(key: str, env: str) -> str:
    key = key.strip()
    if not key:
        raise ConfigError(f"{env} is empty")
    if not _KEY.fullmatch(key):
        # Never echo it: a key with a line break would also be a header injection.
        raise ConfigError(f"{env}: not a key (expected printable ASCII without spaces)")
    return key


# ------------------------------------------------------------------ fetching


def fetch_reports(
    provider: str,
    since: dt.datetime,
    until: dt.datetime,
    *,
    base_url: str,
    admin_key: str,
    directory: Path,
    bucket_width: str = "1h",
    retry: FetchRetry | None = None,
    clock: Clock | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> list[Path]:
    """Fetch ``provider``'s usage and cost reports from ``since`` to ``until`` into ``directory``.

    ``provider`` is ``openai`` or ``anthropic``; naive datetimes are UTC; the range is
    widened to whole seconds. ``bucket_width`` (``1m``, ``1h``, ``1d``) applies to the
    usage report; the cost reports have daily buckets only. Returns the paths written,
    usage first: ``<provider>-usage.jsonl`` and ``<provider>-costs.jsonl``, one page
    per line, each replaced if it exists. ``clock`` (wall time, for ``Retry-After``
    dates and the retry deadline), ``sleep`` and ``rng`` (the jitter) are for tests.
    """
    spec = _provider(provider)
    key = _checked_key(admin_key, spec.key_env)
    base = check_base_url(base_url)
    if bucket_width not in BUCKET_WIDTHS:
        raise ConfigError(
            f"--bucket-width: expected one of {', '.join(BUCKET_WIDTHS)}, got {bucket_width!r}"
        )
    start = math.floor(_utc(since).timestamp())
    end = math.ceil(_utc(until).timestamp())
    if end <= start:
        raise ConfigError(
            f"--until ({spec.moment(end)}) must be after --since ({spec.moment(start)})"
        )
    client = _Client(
        spec,
        key,
        base,
        retry or FetchRetry(),
        clock or SystemClock(),
        sleep,
        rng or random.Random(),
    )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write the reports into {directory}: {exc.strerror}") from None
    written: list[Path] = []
    for report in spec.reports:
        width = bucket_width if bucket_width in report.limits else next(iter(report.limits))
        query = [
            ("bucket_width", width),
            (spec.start_param, spec.moment(start)),
            (spec.end_param, spec.moment(end)),
            ("limit", str(report.limits[width])),
            *((spec.group_param, group) for group in report.group_by),
        ]
        target = directory / f"{spec.name}-{report.kind}.jsonl"
        partial = target.with_name(target.name + ".partial")
        try:
            with partial.open("wb") as out:
                for page in client.pages(report.path, query):
                    out.write(page + b"\n")
            os.replace(partial, target)
        except OSError as exc:  # the network's are caught in _Client: this is the disk
            raise ConfigError(f"cannot write {target}: {exc.strerror}") from None
        finally:
            partial.unlink(missing_ok=True)
        written.append(target)
    return written


class _Retryable(Exception):
    """A failed try worth another one (429, 5xx, no connection)."""

    def __init__(self, reason: str, retry_after: float | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the error it is here: following it would send the key along."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Client:
    """One provider, one key: GET with retries, and the pages of one report."""

    def __init__(
        self,
        spec: _Provider,
        key: str,
        base: str,
        retry: FetchRetry,
        clock: Clock,
        sleep: Callable[[float], None],
        rng: random.Random,
    ) -> None:
        self.spec = spec
        self._key = key
        self._headers = spec.headers(key)
        self.base = base
        self.retry = retry
        self.clock = clock
        self.sleep = sleep
        self.rng = rng
        self._opener = urllib.request.build_opener(_NoRedirect)

    def __repr__(self) -> str:
        return f"<_Client {self.spec.name} {self.base}>"  # never the headers

    def pages(self, path: str, query: Sequence[tuple[str, str]]) -> Iterator[bytes]:
        """Each page's body on one line, following ``next_page`` until ``has_more`` is false."""
        label = f"{self.spec.name} {path}"
        cursors: set[str] = set()
        cursor: str | None = None
        while True:
            params = [*query, ("page", cursor)] if cursor is not None else list(query)
            url = f"{self.base}{path}?{urllib.parse.urlencode(params, safe='[]:')}"
            body = self._get(url, label)
            document = self._page(body, label)
            yield body.replace(b"\r", b"").replace(b"\n", b"").strip()
            if not document.get("has_more"):
                return
            cursor = document.get("next_page")
            if not isinstance(cursor, str) or not cursor or cursor in cursors:
                problem = "repeated" if cursor else "missing"
                raise PayonceError(
                    f"{label}: has_more is true but next_page is {problem}; stopped, not looping"
                )
            cursors.add(cursor)

    def _page(self, body: bytes, label: str) -> dict[str, Any]:
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if not isinstance(document, dict) or not isinstance(document.get("data"), list):
            start = self._clean(body.decode("utf-8", "replace"))[:80]
            raise PayonceError(f"{label}: the answer is not a report page: {start!r}")
        return document

    def _get(self, url: str, label: str) -> bytes:
        started = self.clock.now()
        tries = 0
        while True:
            tries += 1
            try:
                return self._once(url, label)
            except _Retryable as failure:
                elapsed = self.clock.now() - started
                wait = max(self.retry.backoff(tries, self.rng), failure.retry_after or 0.0)
                if tries >= self.retry.attempts or elapsed + wait > self.retry.deadline:
                    raise PayonceError(
                        f"{label}: {failure.reason}; gave up after {tries} tries in {elapsed:.0f} s"
                    ) from None
                self.sleep(wait)

    def _once(self, url: str, label: str) -> bytes:
        request = urllib.request.Request(url, headers=self._headers, method="GET")  # noqa: S310
        try:
            with self._opener.open(request, timeout=self.retry.timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            status, message = exc.code, self._message(exc)
            retry_after = retry_after_seconds(exc.headers, self.clock.now())
            exc.close()
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise PayonceError(f"{label}: {self._clean(str(reason))}") from None
            raise _Retryable(f"cannot connect: {self._clean(str(reason))}", None) from None
        if status in (401, 403):
            raise ConfigError(f"{self.spec.key_env} was refused ({status}): {message}")
        if status in _RETRY_STATUSES or status >= 500:
            raise _Retryable(f"answered {status}: {message}", retry_after)
        if 300 <= status < 400:
            message = f"a redirect, not followed (it would carry the admin key): {message}"
        raise PayonceError(f"{label} answered {status}: {message}")

    def _message(self, exc: urllib.error.HTTPError) -> str:
        """The provider's own error message, on one line, without the key."""
        try:
            body = exc.read()
        except (OSError, http.client.HTTPException):
            body = b""
        text = body.decode("utf-8", "replace")
        try:
            document = json.loads(text)
        except ValueError:
            document = None
        if isinstance(document, dict):
            error = document.get("error")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                text = error["message"]
            elif isinstance(error, str):
                text = error
            elif isinstance(document.get("message"), str):
                text = document["message"]
        if 300 <= exc.code < 400 and exc.headers.get("Location"):
            text = f"Location: {exc.headers['Location']}"
        return self._clean(text)[:_MESSAGE_CHARS] or self._clean(str(exc.reason))

    def _clean(self, text: str) -> str:
        return " ".join(text.replace(self._key, "[redacted]").split())
