"""The simulated provider's request path: refuse, generate, bill, answer (or drop).

One generation request goes through these steps, in this order::

    count the request
    X-Sim-Fail / --fail draw   -> error status, not billed     (refused before work)
    parse and size the body    -> 400, not billed
    sleep the latency          (the generation; keeps running if the client leaves)
    bill                       <- whether or not the client is still connected
    X-Sim-Drop / --drop draw   -> close the connection, no response (still billed)
    answer 200

A request with ``"stream": true`` (chat, completions, messages) is answered with
server-sent events (:mod:`~payonce.sim.streams`) instead::

    count, refuse, parse       as above: errors are JSON, nothing is sent yet
    sleep the latency          the time to first token
    send the head              status, headers and the events before the first
                               token (role chunk; message_start, content_block_start,
                               ping), together
    send one delta per token   each one token interval (--token-rate, X-Sim-Token-Ms)
                               after the previous one; the first one interval after
                               the head. So a stream lasts latency + tokens x interval
    X-Sim-Die-After / --die-mid-stream
                               -> when event N+1 is due, close the connection: the
                               provider crashed, nothing finished, not billed
    send the tail              finish chunk(s) and usage; content_block_stop, message_delta
    bill                       when the generation finishes: after every event but the
                               terminating one, whether or not the client is connected
    X-Sim-Drop / --drop        -> close the connection without the terminating event
                               (billed)
    send the terminator        data: [DONE] / event: message_stop

A client that leaves mid-stream does not stop the generation: the remaining tokens
are still paced (their writes skipped) and the stream is billed at its end with
``client_connected`` false, as providers bill abandoned streams.

Random draws come from one ``random.Random(seed)`` in that order (fault, latency,
then for streams die and die point, then drop; each only when its source is
configured and not overridden by a header; no drop draw for a stream that dies), so
a seeded run answers the same sequence of requests the same way every time. Request
ids come from a separate, unseeded source: ids must stay unique across runs, because
a billing export from two runs with the same seed must not join one run's calls to
the other's.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiohttp import web

from payonce.clock import Clock
from payonce.sim.bodies import anthropic_message, chat_completion, embedding_list, text_completion
from payonce.sim.config import SimConfig
from payonce.sim.faults import RETRY_AFTER_SECONDS, RETRY_AFTER_STATUSES
from payonce.sim.ledger import Ledger, LedgerEntry, credential_ids
from payonce.sim.overrides import Overrides
from payonce.sim.pricing import cost_usd
from payonce.sim.prompts import Ask, parse_chat, parse_completion, parse_embedding, parse_message
from payonce.sim.provider_errors import Api, BadRequest, error_body
from payonce.sim.streams import (
    EventStream,
    chat_completion_stream,
    message_stream,
    text_completion_stream,
)

__all__ = ["ENDPOINTS", "REQUEST_ID_HEADER", "Endpoint", "Simulator"]

REQUEST_ID_HEADER = "x-request-id"
# The Anthropic SDK reads its request id from ``request-id``; send both there.
ANTHROPIC_REQUEST_ID_HEADER = "request-id"
_JSON = "application/json"
_EVENT_STREAM = "text/event-stream"
# Unpaced events are written in batches of about this many bytes, not one by one.
_WRITE_BATCH_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One generation endpoint: where it lives, whose API it imitates, how it reads and answers."""

    path: str
    api: Api
    id_prefix: str
    parse: Callable[[object], Ask]
    render: Callable[[Ask, str, int], bytes]
    stream: Callable[[Ask, str, int], EventStream] | None = None  # None: never streams


ENDPOINTS = (
    Endpoint(
        "/v1/chat/completions",
        Api.OPENAI,
        "chatcmpl-",
        parse_chat,
        chat_completion,
        chat_completion_stream,
    ),
    Endpoint(
        "/v1/completions",
        Api.OPENAI,
        "cmpl-",
        parse_completion,
        text_completion,
        text_completion_stream,
    ),
    # Embeddings bodies carry no id; OpenAI-style ``req_`` ids go in the header only.
    Endpoint("/v1/embeddings", Api.OPENAI, "req_", parse_embedding, embedding_list),
    Endpoint(
        "/v1/messages", Api.ANTHROPIC, "msg_", parse_message, anthropic_message, message_stream
    ),
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
        self._die_rate = config.die_mid_stream
        self._token_interval = config.token_interval

    def new_request_id(self, prefix: str) -> str:
        """A provider request id such as ``chatcmpl-<24 hex digits>``."""
        return f"{prefix}{self._ids.getrandbits(96):024x}"

    async def generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """Handle one request to ``endpoint`` (the steps in the module docstring)."""
        self.ledger.count_request()
        request_id = self.new_request_id(endpoint.id_prefix)
        key = credential_ids(_credential(request), anthropic=endpoint.api is Api.ANTHROPIC)
        try:
            overrides = Overrides.from_headers(request.headers)
            status = overrides.fail_status
            if status is None:
                status = self._faults.draw(self._rng)
            if status is not None:
                return self._refuse(endpoint.api, status, request_id)
            document = await _read_json(request)
            ask = endpoint.parse(document)
            user = _end_user(document)
            if user:
                ask = replace(ask, user=user)
        except BadRequest as exc:
            body = error_body(endpoint.api, 400, exc.message, param=exc.param, code=exc.code)
            return _json_response(body, 400, endpoint.api, request_id)

        delay = overrides.delay
        if delay is None:
            delay = self._latency.sample(self._rng)
        self.ledger.generating += 1
        try:
            if ask.stream and endpoint.stream is not None:
                return await self._stream(request, endpoint, ask, request_id, key, overrides, delay)
            if delay > 0:
                # aiohttp runs handlers with handler_cancellation=False, so this sleep (the
                # generation) runs to the end even if the client disconnects meanwhile.
                await asyncio.sleep(delay)
            now = self._bill(endpoint, ask, request_id, key, _client_connected(request))
        finally:
            self.ledger.generating -= 1
        if self._drop(overrides):
            return _drop_connection(request)
        body = endpoint.render(ask, request_id, int(now))
        response = _json_response(body, 200, endpoint.api, request_id)
        if overrides.no_request_id:
            _hide_request_id(response)
        return response

    async def _stream(
        self,
        request: web.Request,
        endpoint: Endpoint,
        ask: Ask,
        request_id: str,
        key: tuple[str, str],
        overrides: Overrides,
        delay: float,
    ) -> web.StreamResponse:
        """Answer ``ask`` as server-sent events (the stream steps in the module docstring)."""
        assert endpoint.stream is not None
        interval = overrides.token_interval
        if interval is None:
            interval = self._token_interval
        if delay > 0:
            await asyncio.sleep(delay)  # the time to first token

        events = endpoint.stream(ask, request_id, int(self.clock.now()))
        last = events.count - 1  # the terminating event
        die_at = self._die_point(overrides, events.count)
        drop = die_at is None and self._drop(overrides)

        response = web.StreamResponse(
            headers={"Cache-Control": "no-cache", REQUEST_ID_HEADER: request_id}
        )
        if endpoint.api is Api.ANTHROPIC:
            response.headers[ANTHROPIC_REQUEST_ID_HEADER] = request_id
        if overrides.no_request_id:
            _hide_request_id(response)
        response.content_type = _EVENT_STREAM
        response.charset = "utf-8"
        sender = _EventSender(request, response)
        await sender.start()

        loop = asyncio.get_running_loop()
        due = loop.time()
        for index in range(events.count):
            if interval > 0 and events.is_token(index):
                due += interval
                await sender.flush()  # what is due now goes out before the wait
                await asyncio.sleep(due - loop.time())
            if index == die_at:
                await sender.close()
                return response
            if index == last:
                connected = sender.connected and _client_connected(request)
                self._bill(endpoint, ask, request_id, key, connected)
                if drop:
                    await sender.close()
                    return response
            await sender.send(events.event(index))
        await sender.flush()
        return response

    def _bill(
        self,
        endpoint: Endpoint,
        ask: Ask,
        request_id: str,
        key: tuple[str, str],
        connected: bool,
    ) -> float:
        """Bill one finished generation; returns the time it finished.

        ``key`` is the request's (api key id, project or workspace id), from its credential.
        """
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
                client_connected=connected,
                user=ask.user,
                api_key_id=key[0],
                project_id=key[1],
            )
        )
        return now

    def _drop(self, overrides: Overrides) -> bool:
        if overrides.drop is not None:
            return overrides.drop
        return self._drop_rate > 0 and self._rng.random() < self._drop_rate

    def _die_point(self, overrides: Overrides, count: int) -> int | None:
        """How many events a stream of ``count`` sends before it dies; ``None``: it lives.

        Always before the terminating event, so a stream that dies is never billed.
        """
        if overrides.die_after is not None:
            return min(overrides.die_after, count - 1)
        if self._die_rate > 0 and self._rng.random() < self._die_rate:
            # After the first event, before the terminating one (a stream has at least
            # three events: a token, a finish and the terminator).
            return self._rng.randrange(1, count)
        return None

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


def _end_user(document: object) -> str:
    """The end user a request names (OpenAI ``user``, Anthropic ``metadata.user_id``).

    Billing exports can group by it (OpenAI's usage API by ``user_id``); the
    ledger records it so a bill line can be traced to the business request that
    caused it (``payonce demo`` tags each business request this way).
    """
    if not isinstance(document, dict):
        return ""
    user = document.get("user")
    metadata = document.get("metadata")
    if not isinstance(user, str) and isinstance(metadata, dict):
        user = metadata.get("user_id")
    return user[:256] if isinstance(user, str) else ""


def _credential(request: web.Request) -> str:
    """The request's API key: ``x-api-key`` (Anthropic), else the ``Authorization`` bearer.

    Only its hash reaches the ledger (:func:`~payonce.sim.ledger.credential_ids`).
    """
    headers = request.headers
    key = headers.get("x-api-key")
    if key is not None:
        return key
    authorization = headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else authorization


def _client_connected(request: web.Request) -> bool:
    # aiohttp drops the transport when the peer closes (connection_lost); a transport
    # that is closing is as good as gone for answering.
    transport = request.transport
    return transport is not None and not transport.is_closing()


class _EventSender:
    """Writes a stream's events, batched when unpaced, and notes when the client has gone.

    A failed write (the client left) marks the client gone and turns later writes into
    no-ops, so the caller goes on generating and billing as if nothing happened.
    """

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self._request = request
        self._response = response
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.connected = True

    async def start(self) -> None:
        """Send the status line and headers (so ``X-Sim-Die-After: 0`` is a 200, then nothing)."""
        try:
            await self._response.prepare(self._request)
        except ConnectionError:
            self.connected = False

    async def send(self, event: bytes) -> None:
        """Queue one event; write the queue once it is a batch."""
        if not self.connected:
            return
        self._pending.append(event)
        self._pending_bytes += len(event)
        if self._pending_bytes >= _WRITE_BATCH_BYTES:
            await self.flush()

    async def flush(self) -> None:
        """Write what is queued, if the client is still there."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        if not self.connected:
            return
        try:
            await self._response.write(data)
        except ConnectionError:  # aiohttp's ClientConnectionResetError among them
            self.connected = False

    async def close(self) -> None:
        """Write what is queued, then close the connection without ending the stream."""
        await self.flush()
        transport = self._request.transport
        if transport is not None:
            # close(), not abort(): the events already written reach the client first.
            # aiohttp then fails to write the end of the chunked body, which it treats
            # as an ordinary client disconnect (no traceback in the log).
            transport.close()


def _drop_connection(request: web.Request) -> web.Response:
    transport = request.transport
    if transport is not None:
        transport.close()
    # aiohttp then fails to write this response to the closed transport, which it
    # treats as an ordinary client disconnect: no response, no traceback in the log.
    return web.Response(status=204)


def _hide_request_id(response: web.StreamResponse) -> None:
    """Like llama.cpp's server: the id is in the body only (``X-Sim-No-Request-Id``)."""
    response.headers.popall(REQUEST_ID_HEADER, None)
    response.headers.popall(ANTHROPIC_REQUEST_ID_HEADER, None)


def _json_response(body: bytes, status: int, api: Api, request_id: str) -> web.Response:
    response = web.Response(body=body, status=status, content_type=_JSON)
    response.headers[REQUEST_ID_HEADER] = request_id
    if api is Api.ANTHROPIC:
        response.headers[ANTHROPIC_REQUEST_ID_HEADER] = request_id
    return response
