"""The providers' admin usage and cost reports, answered from the simulator's ledger.

=========================================== =================================================
route                                       answer
=========================================== =================================================
GET /v1/organization/usage/completions      OpenAI Usage API, completions (chat, legacy
                                            completions and Responses API entries)
GET /v1/organization/costs                  OpenAI Costs API (every OpenAI entry)
GET /v1/organizations/usage_report/messages Anthropic messages usage report
GET /v1/organizations/cost_report           Anthropic cost report (``amount`` in cents)
=========================================== =================================================

Admin auth, so a client can be tested for sending it: OpenAI routes want
``Authorization: Bearer sk-admin...``, Anthropic routes ``x-api-key: sk-ant-admin...`` and an
``anthropic-version`` header; anything else is a 401 in the provider's error shape (400 for
a missing ``anthropic-version``). The key is neither logged nor echoed.

Entries are bucketed by ``finished_at`` (the simulator's clock) into buckets snapped to
the start of their UTC minute, hour or day. Every bucket in the requested range is
answered, with empty ``results`` when nothing was billed in it (as OpenAI does; the
same is assumed for Anthropic, whose docs do not say).
``limit`` counts buckets per page; ``next_page`` is an opaque ``page_`` cursor.

``/v1/responses`` entries count as completions usage, deliberately. OpenAI's Usage
API has one report for text generation by models, ``usage/completions``; its other
reports are per product (embeddings, moderations, images, audio, vector stores,
code interpreter, file and web search: the openai SDK's ``admin.organization.usage``
lists them), none of them for the Responses API, and no reference page we found
says otherwise. So a Responses API call can only show up there, and a cost fetcher
rehearsed against the simulator must see it there. The Costs API already has every
OpenAI entry, Responses included.
Dimensions not in ``group_by`` are ``null``. Things the simulator does not model are
constants: no cached, audio or server-tool tokens, ``batch`` false, service tier
``default`` (OpenAI) / ``standard`` (Anthropic), context window ``0-200k``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from aiohttp import web

from payonce.sim.ledger import Ledger, LedgerEntry
from payonce.sim.pricing import cost_usd
from payonce.sim.provider_errors import Api, error_body

__all__ = [
    "ADMIN_ROUTES",
    "ANTHROPIC_ADMIN_PREFIX",
    "OPENAI_ADMIN_PREFIX",
    "AdminQueryError",
    "report_handler",
]

OPENAI_ADMIN_PREFIX = "sk-admin"
ANTHROPIC_ADMIN_PREFIX = "sk-ant-admin"

_WIDTHS = {"1m": 60, "1h": 3600, "1d": 86400}
# (default, maximum) buckets per page, as both providers document them.
_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}
_OPENAI_COMPLETIONS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
_ANTHROPIC_MESSAGES = frozenset({"/v1/messages"})

_OPENAI_USAGE_GROUPS = ("project_id", "user_id", "api_key_id", "model", "batch", "service_tier")
_OPENAI_COST_GROUPS = ("project_id", "line_item")
_ANTHROPIC_USAGE_GROUPS = ("api_key_id", "workspace_id", "model", "service_tier", "context_window")
_ANTHROPIC_COST_GROUPS = ("workspace_id", "description")


class AdminQueryError(ValueError):
    """A report query that cannot be answered: 400 (or ``status``) in the provider's shape."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclass(frozen=True, slots=True)
class _Query:
    """What every report shares: the page of buckets, the grouping and the filters."""

    first: int  # start of the first bucket of this page (epoch seconds)
    end: int  # exclusive: no bucket starts at or after it
    width: int
    limit: int
    group_by: tuple[str, ...]
    filters: dict[str, frozenset[str]]

    def page_starts(self) -> list[int]:
        stop = min(self.end, self.first + self.limit * self.width)
        return list(range(self.first, stop, self.width))

    def next_start(self) -> int | None:
        following = self.first + self.limit * self.width
        return following if following < self.end else None


# ------------------------------------------------------------------ query parsing


def _values(request: web.Request, name: str) -> list[str]:
    """``name=a&name=b``, ``name[]=a``, ``name=a,b``: every value, in order."""
    found: list[str] = []
    for raw in (*request.query.getall(name, ()), *request.query.getall(name + "[]", ())):
        found.extend(part.strip() for part in raw.split(",") if part.strip())
    return found


def _one(request: web.Request, name: str) -> str | None:
    values = _values(request, name)
    return values[-1] if values else None


def _width(request: web.Request, allowed: Sequence[str]) -> str:
    width = _one(request, "bucket_width") or "1d"
    if width not in allowed:
        choices = ", ".join(allowed)
        raise AdminQueryError(f"bucket_width must be one of {choices}", param="bucket_width")
    return width


def _limit(request: web.Request, default: int, maximum: int) -> int:
    raw = _one(request, "limit")
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        raise AdminQueryError("limit must be an integer", param="limit") from None
    if not 1 <= limit <= maximum:
        raise AdminQueryError(f"limit must be between 1 and {maximum}", param="limit")
    return limit


def _group_by(request: web.Request, allowed: Sequence[str]) -> tuple[str, ...]:
    groups = _values(request, "group_by")
    for group in groups:
        if group not in allowed:
            raise AdminQueryError(
                f"group_by: {group!r} is not one of {', '.join(allowed)} (payonce sim)",
                param="group_by",
            )
    return tuple(dict.fromkeys(groups))


def _filters(request: web.Request, names: Iterable[str]) -> dict[str, frozenset[str]]:
    return {name: frozenset(values) for name in names if (values := _values(request, name))}


def _snap(moment: int, width: int) -> int:
    return moment - moment % width


def _cursor(token: str | None, decode: Callable[[str], int]) -> int | None:
    if token is None:
        return None
    try:
        if not token.startswith("page_"):
            raise ValueError(token)
        return decode(base64.urlsafe_b64decode(token[5:].encode()).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise AdminQueryError("page: not a next_page token", param="page") from None


def _unix(raw: str | None, name: str) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise AdminQueryError(f"{name} must be an integer (unix seconds)", param=name) from None


def _rfc3339(raw: str | None, name: str) -> int | None:
    if raw is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00").replace(" ", "+"))
    except ValueError:
        raise AdminQueryError(f"{name} must be an RFC 3339 timestamp", param=name) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return math.floor(moment.timestamp())


def _rfc3339_text(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _page_token(text: str) -> str:
    return "page_" + base64.urlsafe_b64encode(text.encode()).decode()


def _query(
    request: web.Request,
    *,
    anthropic: bool,
    widths: Sequence[str],
    groups: Sequence[str],
    filters: Iterable[str],
    limits: tuple[int, int] | None,
    now: float,
) -> _Query:
    width_name = _width(request, widths)
    width = _WIDTHS[width_name]
    start_name, end_name = ("starting_at", "ending_at") if anthropic else ("start_time", "end_time")
    parse = _rfc3339 if anthropic else _unix
    start = parse(_one(request, start_name), start_name)
    if start is None:
        raise AdminQueryError(f"{start_name} is required", param=start_name)
    end = parse(_one(request, end_name), end_name)
    if end is None:
        end = math.floor(now) + 1  # up to and including the current bucket
    default, maximum = limits or _LIMITS[width_name]
    decode: Callable[[str], int] = (
        (lambda text: math.floor(dt.datetime.fromisoformat(text).timestamp())) if anthropic else int
    )
    first = _cursor(_one(request, "page"), decode)
    if first is None:
        first = _snap(start, width)
    return _Query(
        first=first,
        end=end,
        width=width,
        limit=_limit(request, default, maximum),
        group_by=_group_by(request, groups),
        filters=_filters(request, filters),
    )


# ------------------------------------------------------------------ aggregation


def _buckets(query: _Query, entries: Iterable[LedgerEntry]) -> dict[int, list[LedgerEntry]]:
    starts = query.page_starts()
    by_start: dict[int, list[LedgerEntry]] = {start: [] for start in starts}
    if not starts:
        return by_start
    low, high = starts[0], min(query.end, starts[-1] + query.width)
    for entry in entries:
        moment = math.floor(entry.finished_at)
        if low <= moment < high:
            by_start[_snap(moment - low, query.width) + low].append(entry)
    return by_start


def _matches(
    entry: LedgerEntry, filters: dict[str, frozenset[str]], fields: dict[str, str]
) -> bool:
    return all(getattr(entry, fields[name]) in wanted for name, wanted in filters.items())


def _cents(amount: Decimal) -> str:
    text = format(amount * 100, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text or "0"


# ------------------------------------------------------------------ the four reports


def _openai_usage(ledger: Ledger, query: _Query) -> list[dict[str, Any]]:
    fields = {
        "project_ids": "project_id",
        "api_key_ids": "api_key_id",
        "models": "model",
        "user_ids": "user",
    }
    entries = [
        e
        for e in ledger.entries
        if e.endpoint in _OPENAI_COMPLETIONS and _matches(e, query.filters, fields)
    ]
    data: list[dict[str, Any]] = []
    for start, bucket in _buckets(query, entries).items():
        groups: dict[tuple[Any, ...], list[LedgerEntry]] = {}
        for entry in bucket:
            dims = {
                "project_id": entry.project_id,
                "user_id": entry.user or None,
                "api_key_id": entry.api_key_id,
                "model": entry.model,
                "batch": False,
                "service_tier": "default",
            }
            key = tuple(dims[g] if g in query.group_by else None for g in _OPENAI_USAGE_GROUPS)
            groups.setdefault(key, []).append(entry)
        results = []
        for key, members in sorted(groups.items(), key=lambda item: repr(item[0])):
            result: dict[str, Any] = {
                "object": "organization.usage.completions.result",
                "input_tokens": sum(e.input_tokens for e in members),
                "output_tokens": sum(e.output_tokens for e in members),
                "input_cached_tokens": 0,
                "input_audio_tokens": 0,
                "output_audio_tokens": 0,
                "num_model_requests": len(members),
            }
            result.update(zip(_OPENAI_USAGE_GROUPS, key, strict=True))
            results.append(result)
        data.append(
            {
                "object": "bucket",
                "start_time": start,
                "end_time": start + query.width,
                "results": results,
            }
        )
    return data


def _line_items(entry: LedgerEntry) -> list[tuple[str, str, Decimal]]:
    """(kind, token type, USD) per priced part of an entry: its input and its output."""
    return [
        (
            "input",
            "uncached_input_tokens",
            Decimal(repr(cost_usd(entry.model, entry.input_tokens, 0))),
        ),
        ("output", "output_tokens", Decimal(repr(cost_usd(entry.model, 0, entry.output_tokens)))),
    ]


def _openai_costs(ledger: Ledger, query: _Query) -> list[dict[str, Any]]:
    fields = {"project_ids": "project_id"}
    entries = [
        e
        for e in ledger.entries
        if e.endpoint not in _ANTHROPIC_MESSAGES and _matches(e, query.filters, fields)
    ]
    data: list[dict[str, Any]] = []
    for start, bucket in _buckets(query, entries).items():
        amounts: dict[tuple[str | None, str | None], Decimal] = {}
        for entry in bucket:
            project = entry.project_id if "project_id" in query.group_by else None
            key: tuple[str | None, str | None]
            if "line_item" in query.group_by:
                for kind, _, usd in _line_items(entry):
                    key = (f"{entry.model}, {kind}", project)
                    amounts[key] = amounts.get(key, Decimal(0)) + usd
            else:
                key = (None, project)
                amounts[key] = amounts.get(key, Decimal(0)) + Decimal(repr(entry.cost_usd))
        results = [
            {
                "object": "organization.costs.result",
                "amount": {"value": float(amount), "currency": "usd"},
                "line_item": line_item,
                "project_id": project,
            }
            for (line_item, project), amount in sorted(amounts.items(), key=lambda i: repr(i[0]))
        ]
        data.append(
            {
                "object": "bucket",
                "start_time": start,
                "end_time": start + query.width,
                "results": results,
            }
        )
    return data


def _anthropic_usage(ledger: Ledger, query: _Query) -> list[dict[str, Any]]:
    fields = {"api_key_ids": "api_key_id", "workspace_ids": "project_id", "models": "model"}
    entries = [
        e
        for e in ledger.entries
        if e.endpoint in _ANTHROPIC_MESSAGES and _matches(e, query.filters, fields)
    ]
    data: list[dict[str, Any]] = []
    for start, bucket in _buckets(query, entries).items():
        groups: dict[tuple[Any, ...], list[LedgerEntry]] = {}
        for entry in bucket:
            dims = {
                "api_key_id": entry.api_key_id,
                "workspace_id": entry.project_id,
                "model": entry.model,
                "service_tier": "standard",
                "context_window": "0-200k",
            }
            key = tuple(dims[g] if g in query.group_by else None for g in _ANTHROPIC_USAGE_GROUPS)
            groups.setdefault(key, []).append(entry)
        results = []
        for key, members in sorted(groups.items(), key=lambda item: repr(item[0])):
            result: dict[str, Any] = {
                "uncached_input_tokens": sum(e.input_tokens for e in members),
                "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
                "cache_read_input_tokens": 0,
                "output_tokens": sum(e.output_tokens for e in members),
                "server_tool_use": {"web_search_requests": 0},
            }
            result.update(zip(_ANTHROPIC_USAGE_GROUPS, key, strict=True))
            results.append(result)
        data.append(
            {
                "starting_at": _rfc3339_text(start),
                "ending_at": _rfc3339_text(start + query.width),
                "results": results,
            }
        )
    return data


def _anthropic_costs(ledger: Ledger, query: _Query) -> list[dict[str, Any]]:
    entries = [e for e in ledger.entries if e.endpoint in _ANTHROPIC_MESSAGES]
    by_description = "description" in query.group_by
    data: list[dict[str, Any]] = []
    for start, bucket in _buckets(query, entries).items():
        amounts: dict[tuple[str | None, ...], Decimal] = {}
        for entry in bucket:
            workspace = entry.project_id if "workspace_id" in query.group_by else None
            key: tuple[str | None, ...]
            if by_description:
                for kind, token_type, usd in _line_items(entry):
                    words = "Input Tokens" if kind == "input" else "Output Tokens"
                    key = (workspace, f"{entry.model} Usage - {words}", entry.model, token_type)
                    amounts[key] = amounts.get(key, Decimal(0)) + usd
            else:
                key = (workspace, None, None, None)
                amounts[key] = amounts.get(key, Decimal(0)) + Decimal(repr(entry.cost_usd))
        results = [
            {
                "currency": "USD",
                "amount": _cents(amount),
                "workspace_id": workspace,
                "description": description,
                "cost_type": "tokens" if by_description else None,
                "context_window": "0-200k" if by_description else None,
                "model": model,
                "service_tier": "standard" if by_description else None,
                "token_type": token_type,
            }
            for (workspace, description, model, token_type), amount in sorted(
                amounts.items(), key=lambda i: repr(i[0])
            )
        ]
        data.append(
            {
                "starting_at": _rfc3339_text(start),
                "ending_at": _rfc3339_text(start + query.width),
                "results": results,
            }
        )
    return data


# ------------------------------------------------------------------ handlers


@dataclass(frozen=True, slots=True)
class _Report:
    path: str
    api: Api
    widths: tuple[str, ...]
    groups: tuple[str, ...]
    filters: tuple[str, ...]
    limits: tuple[int, int] | None  # None: per bucket width (_LIMITS)
    build: Callable[[Ledger, _Query], list[dict[str, Any]]]


ADMIN_ROUTES = (
    _Report(
        "/v1/organization/usage/completions",
        Api.OPENAI,
        ("1m", "1h", "1d"),
        _OPENAI_USAGE_GROUPS,
        ("project_ids", "api_key_ids", "models", "user_ids"),
        None,
        _openai_usage,
    ),
    _Report(
        "/v1/organization/costs",
        Api.OPENAI,
        ("1d",),
        _OPENAI_COST_GROUPS,
        ("project_ids",),
        (7, 180),
        _openai_costs,
    ),
    _Report(
        "/v1/organizations/usage_report/messages",
        Api.ANTHROPIC,
        ("1m", "1h", "1d"),
        _ANTHROPIC_USAGE_GROUPS,
        ("api_key_ids", "workspace_ids", "models"),
        None,
        _anthropic_usage,
    ),
    _Report(
        "/v1/organizations/cost_report",
        Api.ANTHROPIC,
        ("1d",),
        _ANTHROPIC_COST_GROUPS,
        (),
        (7, 31),
        _anthropic_costs,
    ),
)


def _authorize(request: web.Request, api: Api) -> None:
    if api is Api.OPENAI:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip().startswith(OPENAI_ADMIN_PREFIX):
            raise AdminQueryError(
                "This endpoint needs an admin API key (payonce sim: any Bearer key "
                f"starting {OPENAI_ADMIN_PREFIX!r}).",
                status=401,
            )
        return
    if not request.headers.get("x-api-key", "").startswith(ANTHROPIC_ADMIN_PREFIX):
        raise AdminQueryError(
            "invalid x-api-key: this endpoint needs an admin API key (payonce sim: any "
            f"x-api-key starting {ANTHROPIC_ADMIN_PREFIX!r})",
            status=401,
        )
    if "anthropic-version" not in request.headers:
        raise AdminQueryError("anthropic-version: header is required")


def report_handler(
    report: _Report, ledger: Callable[[web.Request], Ledger], now: Callable[[], float]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The aiohttp handler for ``report``, reading the ledger ``ledger(request)`` returns."""
    anthropic = report.api is Api.ANTHROPIC

    async def handle(request: web.Request) -> web.Response:
        try:
            _authorize(request, report.api)
            query = _query(
                request,
                anthropic=anthropic,
                widths=report.widths,
                groups=report.groups,
                filters=report.filters,
                limits=report.limits,
                now=now(),
            )
        except AdminQueryError as exc:
            code = "invalid_api_key" if exc.status == 401 and not anthropic else None
            body = error_body(report.api, exc.status, exc.message, param=exc.param, code=code)
            return web.Response(body=body, status=exc.status, content_type="application/json")
        data = report.build(ledger(request), query)
        following = query.next_start()
        next_page = None
        if following is not None:
            next_page = _page_token(_rfc3339_text(following) if anthropic else str(following))
        document: dict[str, Any] = {"data": data, "has_more": next_page is not None}
        document["next_page"] = next_page
        if not anthropic:
            document = {"object": "page", **document}
        return web.json_response(document)

    return handle
