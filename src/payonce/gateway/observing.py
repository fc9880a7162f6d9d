"""Per-request bookkeeping for the call log and the metrics.

Each proxied request gets a :class:`CallRecord` filled in along its way; when
the response is finished, :meth:`Observer.finish` counts it and writes its call
log line. Facts about the upstream call (status, provider request id, usage,
cost) come from the run that made it (:class:`UpstreamFacts`), so a replay or a
join reports what the original call cost once.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import time

from payonce.clock import Clock
from payonce.errors import (
    BodyTooLarge,
    FingerprintMismatch,
    IdempotencyKeyRequired,
    InvalidIdempotencyKey,
    ProblemError,
    RequestInProgress,
    TenantLimited,
)
from payonce.gateway.asgi import Message, Send
from payonce.gateway.sse import first_stream_id
from payonce.observe.calllog import CallLogSink, CallRecord
from payonce.observe.facts import UpstreamFacts
from payonce.observe.metrics import Metrics
from payonce.observe.scenarios import Scenarios, endpoint_of
from payonce.observe.tracing import Tracing
from payonce.observe.usage import model_usage_and_id
from payonce.store import Record, Store

__all__ = [
    "Observer",
    "UpstreamFacts",
    "model_of",
    "outcome_of",
    "provider_request_id",
    "stored_facts",
    "stored_request_id",
]

_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
_ids = random.Random()
# A forked --workers worker starts from its own seed: the supervisor's state,
# copied into every worker, would give them all the same request ids.
os.register_at_fork(after_in_child=_ids.seed)


def model_of(body: bytes) -> str | None:
    """The ``model`` of a JSON request body, found without parsing the whole body."""
    match = _MODEL.search(body, 0, 4096)
    return match.group(1).decode("utf-8", "replace") if match else None


def provider_request_id(headers: tuple[tuple[str, str], ...]) -> str | None:
    """The provider's id of a response, the key to join with its bill.

    OpenAI sends ``x-request-id``, Anthropic ``request-id``, AWS Bedrock
    ``x-amzn-requestid`` (the ``requestId`` of its model invocation log).
    OpenRouter's ``x-generation-id`` (the ``gen-...`` id its generation records
    are keyed by) wins over any of those, which a proxy in between may add.
    """
    found = None
    for name, value in headers:
        lowered = name.lower()
        if lowered == "x-generation-id":
            return value
        if found is None and lowered in ("x-request-id", "request-id", "x-amzn-requestid"):
            found = value
    return found


def stored_facts(record: Record) -> UpstreamFacts:
    """What the call behind a stored record cost, for the call log of its replays."""
    response = record.response
    facts = UpstreamFacts(usage=record.usage, cost_usd=record.cost_usd)
    if response is not None:
        facts.status = response.status
        facts.request_id = provider_request_id(response.headers)
        facts.stream = response.stream
        if not response.stream:
            facts.model, _, body_id = model_usage_and_id(response.body, response.headers)
            facts.request_id = facts.request_id or body_id
    return facts


async def stored_request_id(store: Store, record: Record) -> str | None:
    """The provider's request id of a stored response, as its call was logged.

    A request id header, else the body's ``id``, else (a stream) the first
    ``id`` among its first events: llama.cpp's server, and many self-hosted
    ones, send no header.
    """
    response = record.response
    if response is None:
        return None
    found = provider_request_id(response.headers)
    if found is not None:
        return found
    if not response.stream:
        return model_usage_and_id(response.body, response.headers)[2]
    return first_stream_id(await store.read_events(record.tenant, record.key))


def outcome_of(error: ProblemError) -> str:
    if isinstance(error, RequestInProgress):
        return "conflict"
    if isinstance(error, FingerprintMismatch):
        return "mismatch"
    if isinstance(error, InvalidIdempotencyKey | IdempotencyKeyRequired | BodyTooLarge):
        return "rejected"
    if error.status < 500:
        return "rejected"
    return "error"


class Observer:
    """Counts requests and upstream calls; writes the call log when one is configured."""

    def __init__(
        self,
        metrics: Metrics | None,
        call_log: CallLogSink | None,
        clock: Clock,
        tracing: Tracing | None = None,
        scenarios: Scenarios | None = None,
    ) -> None:
        self.metrics = metrics
        self.call_log = call_log
        self.clock = clock
        self.tracing = tracing
        self.scenarios = scenarios = scenarios or Scenarios()
        self._scenario_headers = scenarios.headers
        self._by_tenant = scenarios.by_tenant

    def start(
        self, method: str, path: str, tenant: str, headers: list[tuple[bytes, bytes]]
    ) -> CallRecord:
        record = CallRecord(
            request_id=f"{_ids.getrandbits(64):016x}",
            method=method,
            path=path,
            tenant=tenant,
            started=time.perf_counter(),
            endpoint=endpoint_of(path),
        )
        if self.tracing is not None:
            self.tracing.start_request(record, headers)
        scenario_headers = self._scenario_headers
        named = False
        for name, value in headers:
            if name == b"x-stainless-retry-count":
                with contextlib.suppress(ValueError):
                    record.client_retry = int(value)
            elif name in scenario_headers:
                named = True
        if named:
            scenarios = self.scenarios
            record.scenario = scenario = scenarios.of(headers)
            record.scenario_label = scenarios.label(scenario)
        if record.scenario is None and self._by_tenant:
            scenario = self._by_tenant.get(tenant)
            if scenario is not None:
                record.scenario = scenario
                record.scenario_label = self.scenarios.label(scenario)
        metrics = self.metrics
        if metrics is not None:
            metrics.in_flight_now += 1
            if metrics.shared:
                metrics.started()
        return record

    @staticmethod
    def wrap_send(send: Send, record: CallRecord) -> Send:
        """``send`` that notes the status and adds ``x-payonce-request-id``."""
        request_id = record.request_id.encode()

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                record.response_started = True
                # A copy: cached replays share their header list between requests.
                message = {
                    **message,
                    "headers": [*message["headers"], (b"x-payonce-request-id", request_id)],
                }
            await send(message)

        return observed

    def apply(self, record: CallRecord, facts: UpstreamFacts | None, *, saved: bool) -> None:
        """Copy an upstream call's facts onto a request (as its cost, or as cost saved)."""
        if facts is None:
            return
        record.upstream_status = facts.status
        record.upstream_request_id = facts.request_id
        record.model = record.model or facts.model
        record.usage = dict(facts.usage) if facts.usage is not None else None
        record.usage_missing_reason = facts.usage_missing_reason()
        record.stream = facts.stream
        record.not_stored = facts.not_stored
        record.price_source = facts.price_source
        if saved:
            record.saved_usd = facts.cost_usd
            record.cost_usd = 0.0
            if self.metrics is None:
                return
            add = self.metrics.deferred.add
            if facts.usage:
                add(self.metrics.saved_input, facts.usage.get("input_tokens", 0))
                add(self.metrics.saved_output, facts.usage.get("output_tokens", 0))
            if facts.cost_usd:
                add(self.metrics.saved_cost_of(facts.model), facts.cost_usd)
        else:
            record.cost_usd = facts.cost_usd
            record.list_cost_usd = facts.list_cost_usd
            record.upstream_attempts = facts.attempts
            record.upstream_latency = facts.latency
            record.upstream_cancelled = facts.cancelled

    def upstream_call(self, facts: UpstreamFacts, path: str) -> None:
        """Count one upstream call: its status, latency, tokens and cost."""
        if self.tracing is not None:
            self.tracing.upstream(facts, path)
        if self.metrics is not None:
            self.metrics.upstream_call(facts)
            if facts.not_stored is not None:
                self.metrics.deferred.add(self.metrics.unstored[facts.not_stored])

    def limited(self, error: TenantLimited) -> None:
        """Count a request refused by a per-tenant limit (its line says rejected, 429)."""
        if self.metrics is not None:
            self.metrics.deferred.add(self.metrics.limited[error.limit])

    def finish(self, record: CallRecord, finished: float | None = None) -> None:
        """Log and count a request; ``finished`` (``perf_counter()``) defaults to now."""
        if finished is None:
            finished = time.perf_counter()
        if self.call_log is not None:
            self.call_log.write(record.line(finished, self.clock.now()))
        if self.tracing is not None:
            self.tracing.request(record, finished)
        if self.metrics is not None:
            self.metrics.answered(record, finished)
