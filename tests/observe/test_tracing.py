"""OpenTelemetry spans, exported to the SDK's in-memory exporter and read against the conventions.

The conventions checked: OpenTelemetry semantic conventions v1.37.0 (the version
:data:`payonce.observe.tracing.SEMCONV_VERSION` names, the first with
``gen_ai.provider.name``), for GenAI client inference spans
(https://github.com/open-telemetry/semantic-conventions/blob/v1.37.0/docs/gen-ai/gen-ai-spans.md)
and HTTP server spans: name, kind, required and conditionally required attributes,
status on error, and the parent/child shape of a keyed call, a replay and a joined
duplicate through a real gateway (in-process, the ASGI app in front of ``payonce sim``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import httpx2 as httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.trace import SpanKind, StatusCode

from payonce.clock import ManualClock
from payonce.config import GatewaySettings
from payonce.gateway.app import Gateway
from payonce.gateway.observing import Observer, UpstreamFacts
from payonce.gateway.upstream import Upstream
from payonce.observe.metrics import Metrics
from payonce.observe.tracing import SEMCONV_VERSION, Tracing, operation_of, provider_of
from payonce.store import MemoryStore
from tests.support.sim import Sim

AUTH = {"Authorization": "Bearer sk-test-tracing"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "trace me"}]}
# The caller's span, as W3C trace context: the gateway's spans must join its trace.
CALLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01"

# gen_ai.* attributes of the registry the conventions define, and the ones v1.37.0
# replaced (gen_ai.system by gen_ai.provider.name; the usage names of v1.26 before it).
REGISTRY = {
    value
    for name, value in vars(gen_ai_attributes).items()
    if name.startswith("GEN_AI_") and isinstance(value, str)
}
REPLACED = {"gen_ai.system", "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"}
PROVIDERS = {member.value for member in gen_ai_attributes.GenAiProviderNameValues}
OPERATIONS = {member.value for member in gen_ai_attributes.GenAiOperationNameValues}


def check_inference_span(span: ReadableSpan) -> None:
    """A GenAI client inference span as v1.37.0 describes it."""
    attributes = dict(span.attributes or {})
    assert span.kind is SpanKind.CLIENT
    operation, model = attributes["gen_ai.operation.name"], attributes.get("gen_ai.request.model")
    assert operation in OPERATIONS  # Required, a well-known value where one applies
    assert attributes["gen_ai.provider.name"] in PROVIDERS  # Required
    assert span.name == (f"{operation} {model}" if model else operation)
    if "server.address" in attributes:  # server.port: Conditionally Required with it
        assert isinstance(attributes["server.port"], int)
    gen_ai = {key for key in attributes if key.startswith("gen_ai.")}
    assert gen_ai <= REGISTRY, gen_ai - REGISTRY
    assert not gen_ai & REPLACED
    failed = span.status.status_code is StatusCode.ERROR
    assert failed == ("error.type" in attributes), attributes  # Conditionally Required


def check_server_span(span: ReadableSpan) -> None:
    """An HTTP server span: named by its method (no route), with the required attributes."""
    attributes = dict(span.attributes or {})
    assert span.kind is SpanKind.SERVER
    assert span.name == attributes["http.request.method"]
    assert {"url.path", "url.scheme", "http.response.status_code"} <= set(attributes)
    assert not [key for key in attributes if key.startswith("gen_ai.")]
    failed = attributes["http.response.status_code"] >= 500
    assert failed == (span.status.status_code is StatusCode.ERROR)
    assert failed == ("error.type" in attributes)


# ------------------------------------------------------------------------- the pieces


def test_operations_and_providers_are_the_conventions_names() -> None:
    assert operation_of("/v1/chat/completions") == "chat"
    assert operation_of("/v1/messages") == "chat"
    assert operation_of("/openai/deployments/x/chat/completions?api-version=1") == "chat"
    assert operation_of("/v1/completions") == "text_completion"
    assert operation_of("/v1/embeddings") == "embeddings"
    assert operation_of("/v1beta/models/gemini-2.0:generateContent") == "generate_content"
    assert operation_of("/v1/models") is None
    assert operation_of("/v1/files/file-abc") is None
    assert provider_of("api.openai.com", "/v1/chat/completions") == "openai"
    assert provider_of("api.anthropic.com", "/v1/messages") == "anthropic"
    assert provider_of("acme.openai.azure.com", "/openai/deployments/x/chat/completions") == (
        "azure.ai.openai"
    )
    assert provider_of("bedrock-runtime.us-east-1.amazonaws.com", "/model/x/invoke") == (
        "aws.bedrock"
    )
    # Anything else by the API it speaks (vLLM, a proxy): the telemetry's flavour.
    assert provider_of("127.0.0.1", "/v1/messages") == "anthropic"
    assert provider_of("vllm.internal", "/v1/chat/completions") == "openai"
    assert provider_of("notapi.openai.com.evil", "/v1/chat/completions") == "openai"
    used = {operation_of(p) for p in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")}
    assert used <= OPERATIONS
    assert SEMCONV_VERSION == "1.37.0"


def test_one_span_per_request_and_per_upstream_call_with_gen_ai_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(trace, provider)
    tracing.server = ("api.openai.com", 443)
    observer = Observer(Metrics(), None, ManualClock(), tracing)

    record = observer.start("POST", "/v1/chat/completions", "tenant", [])
    record.outcome, record.status, record.key = "forwarded", 200, "k"
    record.model = "gpt-4o-mini"
    facts = UpstreamFacts()
    tracing.start_upstream(facts, record)
    facts.started = time.perf_counter()  # as the run does, once its span is started
    facts.status, facts.request_id, facts.model = 200, "chatcmpl-1", "gpt-4o-mini-2024-07-18"
    facts.usage = {"input_tokens": 5, "output_tokens": 7}
    facts.cost_usd, facts.latency, facts.attempts = 0.001, 0.25, 1
    observer.upstream_call(facts, "/v1/chat/completions")
    observer.finish(record)

    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"POST", "chat gpt-4o-mini"}
    upstream, request = spans["chat gpt-4o-mini"], spans["POST"]
    check_inference_span(upstream)
    check_server_span(request)
    attributes = dict(upstream.attributes or {})
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert attributes["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
    assert attributes["gen_ai.response.id"] == "chatcmpl-1"
    assert attributes["gen_ai.usage.input_tokens"] == 5
    assert attributes["gen_ai.usage.output_tokens"] == 7
    assert (attributes["server.address"], attributes["server.port"]) == ("api.openai.com", 443)
    assert upstream.end_time is not None and upstream.start_time is not None
    assert upstream.end_time - upstream.start_time == pytest.approx(250_000_000, abs=1_000_000)
    assert upstream.parent is not None
    assert upstream.parent.span_id == request.context.span_id
    assert dict(request.attributes or {})["payonce.outcome"] == "forwarded"
    assert dict(request.attributes or {})["payonce.keyed"] is True
    assert facts.span is None and record.span is None  # nothing kept once ended


def test_a_failed_call_and_a_call_that_is_no_gen_ai_operation() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(trace, provider)
    observer = Observer(None, None, ManualClock(), tracing)
    for path, method, status, cancelled in (
        ("/v1/chat/completions", "POST", 429, False),
        ("/v1/chat/completions", "POST", None, False),
        ("/v1/chat/completions", "POST", None, True),
        ("/v1/models", "GET", 200, False),
    ):
        record = observer.start(method, path, "tenant", [])
        facts = UpstreamFacts(started=record.started)
        tracing.start_upstream(facts, record)
        facts.status, facts.cancelled, facts.latency = status, cancelled, 0.01
        observer.upstream_call(facts, path)
        record.outcome, record.status = "passthrough", status or 502
        observer.finish(record)
    spans = [span for span in exporter.get_finished_spans() if span.kind is SpanKind.CLIENT]
    errors = [dict(span.attributes or {}).get("error.type") for span in spans]
    assert errors == ["429", "_OTHER", "cancelled", None]
    for span in spans[:3]:
        check_inference_span(span)
        assert span.name == "chat"  # no model in the request: the operation alone
    models = spans[3]
    assert models.name == "GET"
    assert not [key for key in dict(models.attributes or {}) if key.startswith("gen_ai.")]
    servers = [span for span in exporter.get_finished_spans() if span.kind is SpanKind.SERVER]
    for span in servers:
        check_server_span(span)


# ------------------------------------------------------------------------- through a gateway


class Traced:
    """An in-process gateway in front of the simulator, its spans in memory."""

    def __init__(self, gateway: Gateway, exporter: InMemorySpanExporter) -> None:
        self.gateway = gateway
        self.exporter = exporter
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gateway), base_url="http://payonce.test"
        )

    async def chat(self, key: str | None, **headers: str) -> httpx.Response:
        sent = {**AUTH, **headers}
        if key is not None:
            sent["Idempotency-Key"] = key
        response = await self.client.post("/v1/chat/completions", json=CHAT, headers=sent)
        assert response.status_code in (200, 500), response.text
        return response

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture
async def traced(sim: Sim) -> AsyncIterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    upstream = Upstream(sim.url)
    await upstream.start()
    store = MemoryStore()
    gateway = Gateway(GatewaySettings(upstream=sim.url, store="memory://"), store, upstream)
    # The gateway would take the global tracer provider (open_tracing); this one is the test's.
    tracing = Tracing(trace, provider)
    tracing.server = upstream.server
    gateway.observer.tracing = tracing
    found = Traced(gateway, exporter)
    try:
        yield found
    finally:
        await found.client.aclose()
        await gateway.drain(grace=5)
        await upstream.close()
        await store.close()
        provider.shutdown()


def server_spans(spans: Sequence[ReadableSpan], outcome: str) -> list[ReadableSpan]:
    return [
        span
        for span in spans
        if span.kind is SpanKind.SERVER
        and dict(span.attributes or {}).get("payonce.outcome") == outcome
    ]


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [
        span
        for span in spans
        if span.parent is not None and span.parent.span_id == parent.context.span_id
    ]


async def test_a_keyed_call_is_a_server_span_with_one_inference_span_under_it(
    traced: Traced, sim: Sim
) -> None:
    response = await traced.chat("trace-1", traceparent=TRACEPARENT)
    answer = response.json()
    spans = traced.spans()
    (request,) = server_spans(spans, "forwarded")
    check_server_span(request)
    # In the caller's trace, a child of the caller's span.
    assert request.context.trace_id == CALLER_TRACE
    assert request.parent is not None and request.parent.span_id == CALLER_SPAN
    (upstream,) = children(spans, request)
    check_inference_span(upstream)
    assert upstream.context.trace_id == CALLER_TRACE
    assert upstream.name == "chat gpt-4o-mini"
    attributes = dict(upstream.attributes or {})
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert attributes["gen_ai.response.model"] == answer["model"]
    assert attributes["gen_ai.response.id"] == answer["id"]
    assert attributes["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"]
    host, port = sim.url.removeprefix("http://").split(":")
    assert (attributes["server.address"], attributes["server.port"]) == (host, int(port))
    # The upstream call happened inside the request.
    assert request.start_time is not None and request.end_time is not None
    assert upstream.start_time is not None and upstream.end_time is not None
    assert request.start_time <= upstream.start_time <= upstream.end_time <= request.end_time
    assert len(spans) == 2


async def test_a_replay_is_a_server_span_and_no_upstream_call(traced: Traced) -> None:
    first = await traced.chat("trace-2")
    traced.exporter.clear()
    replay = await traced.chat("trace-2", traceparent=TRACEPARENT)
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == first.content
    spans = traced.spans()
    (request,) = server_spans(spans, "replayed")
    check_server_span(request)
    assert request.context.trace_id == CALLER_TRACE
    assert spans == [request]  # no CLIENT span: nothing was called, nothing billed


async def test_a_joined_duplicate_links_to_the_call_it_waited_for(traced: Traced) -> None:
    leader = asyncio.ensure_future(traced.chat("trace-3", **{"X-Sim-Delay-Ms": "400"}))
    for _ in range(200):
        if traced.gateway.running:
            break
        await asyncio.sleep(0.01)
    assert traced.gateway.running, "the leader never started its upstream call"
    joiners = await asyncio.gather(*(traced.chat("trace-3") for _ in range(2)))
    answer = await leader
    assert [j.content for j in joiners] == [answer.content] * 2
    spans = traced.spans()
    (request,) = server_spans(spans, "forwarded")
    (upstream,) = children(spans, request)
    check_inference_span(upstream)
    joined = server_spans(spans, "joined")
    assert len(joined) == 2
    for span in joined:
        check_server_span(span)
        assert children(spans, span) == []  # no upstream call of its own
        # Its own trace, linked to the one call that answered it.
        assert span.context.trace_id != request.context.trace_id
        assert [link.context.span_id for link in span.links] == [upstream.context.span_id]
        assert [link.context.trace_id for link in span.links] == [upstream.context.trace_id]
    assert len([span for span in spans if span.kind is SpanKind.CLIENT]) == 1


async def test_a_failed_upstream_call_is_an_error_on_both_spans(traced: Traced) -> None:
    response = await traced.chat("trace-4", **{"X-Sim-Fail": "500"})
    assert response.status_code == 500
    spans = traced.spans()
    (request,) = server_spans(spans, "forwarded")
    (upstream,) = children(spans, request)
    for span, check in ((request, check_server_span), (upstream, check_inference_span)):
        check(span)
        assert span.status.status_code is StatusCode.ERROR
        assert dict(span.attributes or {})["error.type"] == "500"
