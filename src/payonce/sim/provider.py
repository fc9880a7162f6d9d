"""The simulated provider's request path: refuse, generate, bill, answer (or drop).

One generation request goes through these steps, in this order::

    count the request
    X-Sim-Fail / --fail draw   -> error status, not billed     (refused before work)
    parse and size the body    -> 400, not billed
    sleep the latency          (the generation; keeps running if the client leaves)
    bill                       <- whether or not the client is still connected
    X-Sim-Drop / --drop draw   -> close the connection, no response (still billed)
    answer 200

Random draws come from one ``random.Random(seed)`` in that order (fault, latency,
drop; each only when its source is configured and not overridden by a header), so a
seeded run answers the same sequence of requests the same way every time. Request ids
come from a separate, unseeded source: ids must stay unique across runs, because a
billing export from two runs with the same seed must not join one run's calls to the
other's.

Streaming (SSE) is not built yet. It will be a second renderer beside
:attr:`Endpoint.render`, writing events to an ``aiohttp.web.StreamResponse`` while the
latency elapses and billing when the last token is generated, as providers do.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from payonce.clock import Clock
from payonce.sim.bodies import anthropic_message, chat_completion, embedding_list, text_completion
from payonce.sim.config import SimConfig
from payonce.sim.faults import RETRY_AFTER_SECONDS, RETRY_AFTER_STATUSES
from payonce.sim.ledger import Ledger, LedgerEntry
from payonce.sim.overrides import Overrides
from payonce.sim.pricing import cost_usd
from payonce.sim.prompts import Ask, parse_chat, parse_completion, parse_embedding, parse_message
from payonce.sim.provider_errors import Api, BadRequest, error_body

__all__ = ["ENDPOINTS", "REQUEST_ID_HEADER", "Endpoint", "Simulator"]

REQUEST_ID_HEADER = "x-request-id"
# The Anthropic SDK reads its request id from ``request-id``; send both there.
ANTHROPIC_REQUEST_ID_HEADER = "request-id"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One generation endpoint: where it lives, whose API it imitates, how it reads and answers."""

    path: str
    api: Api
    id_prefix: str
    parse: Callable[[object], Ask]
    render: Callable[[Ask, str, int], bytes]


ENDPOINTS = (
    Endpoint("/v1/chat/completions", Api.OPENAI, "chatcmpl-", parse_chat, chat_completion),
    Endpoint("/v1/completions", Api.OPENAI, "cmpl-", parse_completion, text_completion),
    # Embeddings bodies carry no id; OpenAI-style ``req_`` ids go in the header only.
    Endpoint("/v1/embeddings", Api.OPENAI, "req_", parse_embedding, embedding_list),
    Endpoint("/v1/messages", Api.ANTHROPIC, "msg_", parse_message, anthropic_message),
)


class Simulator:
    """Serves generation requests as a provider would, and bills them in a :class:`Ledger`."""

    def __init__(self, config: SimConfig, clock: Clock, ledger: Ledger) -> None:
        self.config = config
        self.clock = clock
        self.ledger = ledger
        self._rng = random.Random(config.seed)
        self._ids = random.Random()  # seeded from the OS: see the module docstring
        self._latency = config.latency
        self._faults = config.failures
        self._drop_rate = config.drop_after_compute

    def new_request_id(self, prefix: str) -> str:
        """A provider request id such as ``chatcmpl-<24 hex digits>``."""
        return f"{prefix}{self._ids.getrandbits(96):024x}"

    async def generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """Handle one request to ``endpoint`` (the steps in the module docstring)."""
        self.ledger.count_request()
        request_id = self.new_request_id(endpoint.id_prefix)
        try:
            overrides = Overrides.from_headers(request.headers)
            status = overrides.fail_status
            if status is None:
                status = self._faults.draw(self._rng)
            if status is not None:
                return self._refuse(endpoint.api, status, request_id)
            ask = endpoint.parse(await _read_json(request))
        except BadRequest as exc:
            body = error_body(endpoint.api, 400, exc.message, param=exc.param, code=exc.code)
            return _json_response(body, 400, endpoint.api, request_id)

        delay = overrides.delay
        if delay is None:
            delay = self._latency.sample(self._rng)
        if delay > 0:
            # aiohttp runs handlers with handler_cancellation=False, so this sleep (the
            # generation) runs to the end even if the client disconnects meanwhile.
            await asyncio.sleep(delay)

        now = self.clock.now()
        self.ledger.bill(
            LedgerEntry(
                provider_request_id=request_id,
                model=ask.model,
                endpoint=endpoint.path,
                input_tokens=ask.input_tokens,
                output_tokens=ask.output_tokens,
                cost_usd=cost_usd(ask.model, ask.input_tokens, ask.output_tokens),
                finished_at=now,
                client_connected=_client_connected(request),
            )
        )

        drop = overrides.drop
        if drop is None:
            drop = self._drop_rate > 0 and self._rng.random() < self._drop_rate
        if drop:
            return _drop_connection(request)
        body = endpoint.render(ask, request_id, int(now))
        return _json_response(body, 200, endpoint.api, request_id)

    def _refuse(self, api: Api, status: int, request_id: str) -> web.Response:
        response = _json_response(error_body(api, status), status, api, request_id)
        if status in RETRY_AFTER_STATUSES:
            response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response


async def _read_json(request: web.Request) -> object:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise BadRequest(
            "We could not parse the JSON body of your request. The body must be valid JSON."
        ) from None


def _client_connected(request: web.Request) -> bool:
    # aiohttp drops the transport when the peer closes (connection_lost); a transport
    # that is closing is as good as gone for answering.
    transport = request.transport
    return transport is not None and not transport.is_closing()


def _drop_connection(request: web.Request) -> web.Response:
    transport = request.transport
    if transport is not None:
        transport.close()
    # aiohttp then fails to write this response to the closed transport, which it
    # treats as an ordinary client disconnect: no response, no traceback in the log.
    return web.Response(status=204)


def _json_response(body: bytes, status: int, api: Api, request_id: str) -> web.Response:
    response = web.Response(body=body, status=status, content_type=_JSON)
    response.headers[REQUEST_ID_HEADER] = request_id
    if api is Api.ANTHROPIC:
        response.headers[ANTHROPIC_REQUEST_ID_HEADER] = request_id
    return response
