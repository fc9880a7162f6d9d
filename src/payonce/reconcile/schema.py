"""The fields reconcile works with, the formats it reads, and ``--calls-map``/``--bill-map``.

Every input is reduced to one of two normalized shapes:

- a **call** (one line of a call log): ``business_id``, ``provider_request_id`` and
  optional ``model``, ``endpoint``, ``tag``, ``status``, ``ts``;
- a **bill line**: ``provider_request_id``, ``cost_usd`` and optional ``model``,
  ``endpoint``, ``input_tokens``, ``output_tokens``, ``ts``.

A :class:`SourceFormat` says which column of a file feeds each field. The generic
formats use the field names themselves; the others (payonce call log, simulator
ledger, LiteLLM spend logs) name their own columns. ``--calls-map`` and
``--bill-map`` replace any of those names.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from payonce.errors import ConfigError

__all__ = [
    "BILL_FIELDS",
    "CALL_FIELDS",
    "FORMATS",
    "PAYONCE",
    "REQUEST_JOIN_CALL_FIELDS",
    "STATED_COST_CALL_FIELDS",
    "FieldKind",
    "Side",
    "SourceFormat",
    "formats_for",
    "parse_column_map",
]


class Side(enum.Enum):
    """Which side of the join a file belongs to."""

    CALLS = "calls"
    BILL = "bill"


class FieldKind(enum.Enum):
    """How a field's text is read, which decides what makes a row malformed."""

    TEXT = "text"
    MONEY = "money"  # a number; a bill line without one is malformed
    COUNT = "count"  # an integer
    TIMESTAMP = "timestamp"  # ISO 8601; without an offset it is taken as UTC
    STATUS = "status"  # an HTTP status or a word such as "success"
    AMOUNT = "amount"  # a number that may be absent (a call whose price is unknown)
    FLAG = "flag"  # true or false


CALL_FIELDS: Mapping[str, FieldKind] = MappingProxyType(
    {
        "business_id": FieldKind.TEXT,
        "provider_request_id": FieldKind.TEXT,
        "model": FieldKind.TEXT,
        "endpoint": FieldKind.TEXT,
        "tag": FieldKind.TEXT,
        "status": FieldKind.STATUS,
        "ts": FieldKind.TIMESTAMP,
        # What the upstream did: read only by the aggregated reconciliation, which
        # compares the calls the gateway sent with a provider's usage buckets.
        "outcome": FieldKind.TEXT,
        "upstream_status": FieldKind.COUNT,
        "upstream_attempts": FieldKind.COUNT,
        "upstream_cancelled": FieldKind.FLAG,
        "input_tokens": FieldKind.COUNT,
        "output_tokens": FieldKind.COUNT,
        "cost_usd": FieldKind.AMOUNT,
        # Who priced cost_usd ("provider": the response stated it) and the list price
        # beside a stated cost (the payonce call log's list_cost_usd): stated_costs.
        "price_source": FieldKind.TEXT,
        "list_cost_usd": FieldKind.AMOUNT,
    }
)

# The fields the per-request join needs; the others are read only when asked for.
REQUEST_JOIN_CALL_FIELDS = frozenset(
    ("business_id", "provider_request_id", "model", "endpoint", "tag", "status", "ts")
)
# Read besides them from a call log that states list prices (stated_costs).
STATED_COST_CALL_FIELDS = frozenset(("outcome", "cost_usd", "price_source", "list_cost_usd"))

BILL_FIELDS: Mapping[str, FieldKind] = MappingProxyType(
    {
        "provider_request_id": FieldKind.TEXT,
        "cost_usd": FieldKind.MONEY,
        "model": FieldKind.TEXT,
        "endpoint": FieldKind.TEXT,
        "input_tokens": FieldKind.COUNT,
        "output_tokens": FieldKind.COUNT,
        "ts": FieldKind.TIMESTAMP,
    }
)


def fields_of(side: Side) -> Mapping[str, FieldKind]:
    """The normalized fields of one side."""
    return CALL_FIELDS if side is Side.CALLS else BILL_FIELDS


@dataclass(frozen=True, slots=True)
class SourceFormat:
    """One input format: where its fields come from and what must be there.

    ``columns`` maps a normalized field to the file's column. ``required`` fields
    must exist as columns (a missing one is a one-line error, exit 2); the others
    are read when the file has them. ``signature`` is the set of columns that
    identifies the format when it is detected rather than named.

    ``business_scope`` names a column that qualifies the business id (the
    gateway's keys are scoped by tenant, so ``order-42`` of two tenants is two
    business requests); it is dropped when ``business_id`` is remapped.
    ``unkeyed_retry_flag`` names a boolean column marking a retry sent without a
    business id: its generation is a duplicate of a call that cannot be named.
    """

    name: str
    side: Side
    columns: Mapping[str, str]
    required: frozenset[str]
    signature: frozenset[str] = field(default_factory=frozenset)
    description: str = ""
    business_scope: str | None = None
    unkeyed_retry_flag: str | None = None
    priced: bool = False
    unbilled_flag: str | None = None
    part_column: str | None = None

    def with_defaults(self, columns: Mapping[str, str]) -> SourceFormat:
        """This format reading some optional fields from other columns, when present."""
        if not columns:
            return self
        return replace(self, columns=MappingProxyType({**self.columns, **columns}))

    def with_map(self, overrides: Mapping[str, str]) -> SourceFormat:
        """This format with some fields read from other columns (``--calls-map``)."""
        columns = {**self.columns, **overrides}
        scope = None if "business_id" in overrides else self.business_scope
        # A field the user names explicitly must exist: naming it is a promise.
        return replace(
            self,
            columns=MappingProxyType(columns),
            required=self.required | frozenset(overrides),
            business_scope=scope,
        )


def _fmt(
    name: str,
    side: Side,
    columns: dict[str, str],
    required: set[str],
    signature: set[str] | None = None,
    description: str = "",
    business_scope: str | None = None,
    unkeyed_retry_flag: str | None = None,
    priced: bool = False,
    unbilled_flag: str | None = None,
    part_column: str | None = None,
) -> SourceFormat:
    return SourceFormat(
        name=name,
        side=side,
        columns=MappingProxyType(columns),
        required=frozenset(required),
        signature=frozenset(signature or ()),
        description=description,
        business_scope=business_scope,
        unkeyed_retry_flag=unkeyed_retry_flag,
        priced=priced,
        unbilled_flag=unbilled_flag,
        part_column=part_column,
    )


PAYONCE = _fmt(
    "payonce",
    Side.CALLS,
    {
        "business_id": "key",
        "provider_request_id": "upstream_request_id",
        "model": "model",
        "endpoint": "path",
        "tag": "tenant",
        "status": "status",
        "ts": "ts",
        "outcome": "outcome",
        "upstream_status": "upstream_status",
        "upstream_attempts": "upstream_attempts",
        "upstream_cancelled": "upstream_cancelled",
        "input_tokens": "input_tokens",
        "output_tokens": "output_tokens",
        "cost_usd": "cost_usd",
        "price_source": "price_source",
        "list_cost_usd": "list_cost_usd",
    },
    {"provider_request_id", "business_id"},
    signature={"v", "outcome", "upstream_request_id"},
    description="payonce gateway call log (docs/call-log.md), JSON lines",
    business_scope="tenant",
    unkeyed_retry_flag="unprotected_retry",
)

GENERIC_CALLS = _fmt(
    "generic",
    Side.CALLS,
    {name: name for name in CALL_FIELDS},
    {"business_id", "provider_request_id"},
    description="generic calls: business_id, provider_request_id"
    "[, model, endpoint, tag, status, ts, outcome, upstream_status, upstream_attempts,"
    " upstream_cancelled, input_tokens, output_tokens, cost_usd, price_source, list_cost_usd]",
)

LEDGER = _fmt(
    "ledger",
    Side.BILL,
    {
        "provider_request_id": "provider_request_id",
        "cost_usd": "cost_usd",
        "model": "model",
        "endpoint": "endpoint",
        "input_tokens": "input_tokens",
        "output_tokens": "output_tokens",
        "ts": "finished_at",
    },
    {"provider_request_id", "cost_usd"},
    signature={"provider_request_id", "cost_usd", "finished_at", "client_connected"},
    description="payonce sim ledger export (--ledger FILE), CSV",
)

LITELLM = _fmt(
    "litellm",
    Side.BILL,
    {
        "provider_request_id": "request_id",
        "cost_usd": "spend",
        "model": "model",
        "endpoint": "call_type",
        "input_tokens": "prompt_tokens",
        "output_tokens": "completion_tokens",
        "ts": "startTime",
    },
    {"provider_request_id", "cost_usd"},
    signature={"request_id", "spend", "startTime"},
    description="LiteLLM SpendLogs export, CSV, JSON lines or a JSON array",
)

BEDROCK = _fmt(
    "bedrock-invocations",
    Side.BILL,
    {
        "provider_request_id": "requestId",
        "model": "modelId",
        "endpoint": "operation",
        "input_tokens": "input.inputTokenCount",
        "output_tokens": "output.outputTokenCount",
        "ts": "timestamp",
    },
    {"provider_request_id", "model"},
    signature={"schemaType", "requestId", "modelId"},
    description="AWS Bedrock model invocation logs (S3 objects or a CloudWatch export):"
    " JSON lines or a JSON array, cost from the price table",
    priced=True,
)

OPENROUTER = _fmt(
    "openrouter-generations",
    Side.BILL,
    {
        "provider_request_id": "id",
        "cost_usd": "total_cost",
        "model": "model",
        "endpoint": "api_type",
        "input_tokens": "tokens_prompt",
        "output_tokens": "tokens_completion",
        "ts": "created_at",
    },
    {"provider_request_id", "cost_usd"},
    signature={"id", "total_cost", "tokens_prompt"},
    description='OpenRouter GET /api/v1/generation records ({"data": {...}} per line,'
    " bare records, or a JSON array)",
    unbilled_flag="cancelled",
)

AZURE_APIM = _fmt(
    "azure-apim-llm",
    Side.BILL,
    {
        "provider_request_id": "CorrelationId",
        "model": "ModelName",
        "endpoint": "DeploymentName",
        "input_tokens": "PromptTokens",
        "output_tokens": "CompletionTokens",
        "ts": "TimeGenerated",
    },
    {"provider_request_id", "model"},
    signature={"CorrelationId", "PromptTokens", "CompletionTokens", "ModelName"},
    description="Azure API Management ApiManagementGatewayLlmLog rows (CSV or JSON),"
    " cost from the price table",
    priced=True,
    part_column="SequenceNumber",
)

GENERIC_BILL = _fmt(
    "generic",
    Side.BILL,
    {name: name for name in BILL_FIELDS},
    {"provider_request_id", "cost_usd"},
    description="generic bill: provider_request_id, cost_usd[, model, endpoint,"
    " input_tokens, output_tokens, ts]",
)

# Detection tries the formats with a signature first, in this order.
FORMATS: tuple[SourceFormat, ...] = (
    PAYONCE,
    GENERIC_CALLS,
    LEDGER,
    LITELLM,
    BEDROCK,
    OPENROUTER,
    AZURE_APIM,
    GENERIC_BILL,
)


def formats_for(side: Side) -> tuple[SourceFormat, ...]:
    """The formats of one side, detectable ones first and the generic one last."""
    return tuple(fmt for fmt in FORMATS if fmt.side is side)


def format_named(side: Side, name: str) -> SourceFormat:
    """The format called ``name`` (``--calls-format``/``--bill-format``)."""
    for fmt in formats_for(side):
        if fmt.name == name:
            return fmt
    names = ", ".join(fmt.name for fmt in formats_for(side))
    raise ConfigError(f"--{side.value}-format: unknown format {name!r} (one of: {names})")


def parse_column_map(text: str | None, side: Side) -> dict[str, str]:
    """``"business_id=order_id,tag=team"`` as ``{"business_id": "order_id", ...}``.

    Field names are checked against the side's fields; column names are kept
    exactly (JSON sources also accept a dotted path into nested objects).
    """
    flag = f"--{side.value}-map"
    fields = fields_of(side)
    result: dict[str, str] = {}
    if not text:
        return result
    for item in text.split(","):
        name, sep, column = item.partition("=")
        name, column = name.strip(), column.strip()
        if not item.strip():
            continue
        if not sep or not name or not column:
            raise ConfigError(f"{flag}: expected FIELD=COLUMN, got {item.strip()!r}")
        if name not in fields:
            raise ConfigError(f"{flag}: unknown field {name!r} (one of: {', '.join(fields)})")
        if name in result:
            raise ConfigError(f"{flag}: field {name!r} mapped twice")
        result[name] = column
    return result
