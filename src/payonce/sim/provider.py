"""The simulated provider's request path: refuse, generate, bill, answer (or drop).

One generation request goes through these steps, in this order::

    count the request
    X-Sim-Fail / --fail draw   -> error status, not billed     (refused before work)
    parse and size the body    -> 400, not billed
    sleep the latency          (the generation; keeps running if the client leaves)
    bill                       <- whether or not the client is still connected
    X-Sim-Drop / --drop draw   -> close the connection, no response (still billed)
    answer 200

A request with ``"stream": true`` (chat, completions, responses, messages) is
answered with server-sent events (:mod:`~payonce.sim.streams`,
:mod:`~payonce.sim.responses`) instead::

    count, refuse, parse       as above: errors are JSON, nothing is sent yet
    sleep the latency          the time to first token (with --keep-alive /
                               X-Sim-Keep-Alive-Ms: status and headers first, then a
                               comment ": OPENROUTER PROCESSING" every interval of it)
    send the head              status, headers and the events before the first
                               token (role chunk; message_start, content_block_start,
                               ping), together
    send one delta per token   each one token interval (--token-rate, X-Sim-Token-Ms)
                               after the previous one; the first one interval after
                               the head. So a stream lasts latency + tokens x interval
                               (keep-alive comments in a wait longer than theirs)
    X-Sim-Die-After / --die-mid-stream
                               -> when event N+1 is due, close the connection: the
                               provider crashed, nothing finished, not billed
    send the tail              finish chunk(s) and usage; content_block_stop, message_delta
    bill                       when the generation finishes: after every event but the
                               terminating one, whether or not the client is connected
    X-Sim-Drop / --drop        -> close the connection without the terminating event
                               (billed)
    send the terminator        data: [DONE] / event: message_stop / response.completed

A client that leaves mid-stream does not stop the generation: the remaining tokens
are still paced (their writes skipped) and the stream is billed at its end with
``client_connected`` false, as providers bill abandoned streams.

``/v1/responses`` does the same, and keeps the response for ``GET /v1/responses/{id}``
unless ``"store": false`` (:mod:`~payonce.sim.response_store`): ``in_progress`` from
the parse on, the answer's object once billed, ``failed`` if its stream died. With
``"background": true`` (and no ``stream``) the order is::

    count, refuse, parse       as above
    store it queued            and start the generation in the background
    X-Sim-Drop / --drop draw   -> close the connection, no response (the generation
                               still runs, and is billed: the client never learns its id)
    answer 200                 the queued object, at once
    (in the background)        in_progress, sleep the latency, bill with
                               client_connected false (nobody waits on it), store
                               the finished object

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
from typing import Protocol

from aiohttp import web

from payonce.clock import Clock
from payonce.sim.bodies import anthropic_message, chat_completion, embedding_list, text_completion
from payonce.sim.config import SimConfig
from payonce.sim.faults import RETRY_AFTER_SECONDS, RETRY_AFTER_STATUSES
from payonce.sim.ledger import Ledger, LedgerEntry, credential_ids, credential_of
from payonce.sim.overrides import Overrides
from payonce.sim.pricing import cost_usd
from payonce.sim.profiles import Wire, with_cost
from payonce.sim.prompts import (
    Ask,
    ResponsesAsk,
    parse_chat,
    parse_completion,
    parse_embedding,
    parse_message,
    parse_responses,
)
from payonce.sim.provider_errors import Api, BadRequest, error_body
from payonce.sim.response_store import StoredResponses
from payonce.sim.responses import ResponseObject, ResponseReply
from payonce.sim.streams import (
    PING,
    EventStream,
    chat_completion_stream,
    message_stream,
    text_completion_stream,
)
from payonce.sim.wire import (
    ANTHROPIC_REQUEST_ID_HEADER,
    EVENT_STREAM,
    REQUEST_ID_HEADER,
    EventSender,
    client_connected,
    drop_connection,
    hide_request_id,
    json_response,
)

__all__ = ["ENDPOINTS", "REQUEST_ID_HEADER", "RESPONSES", "Endpoint", "Reply", "Simulator"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One generation endpoint: where it lives, whose API it imitates, how it reads and answers.

    ``render`` and ``stream`` answer from the ask alone; ``None`` for ``/v1/responses``,
    whose answers are :class:`~payonce.sim.responses.ResponseReply` objects, which
    also keep the stored response up to date.
    """

    path: str
    api: Api
    id_prefix: str
    parse: Callable[[object], Ask]
    render: Callable[[Ask, str, int], bytes] | None = None
    stream: Callable[[Ask, str, int], EventStream] | None = None  # None: never streams


class Reply(Protocol):
    """How one admitted request is answered, and told how its generation went."""

    def events(self, first_token: float, interval: float) -> EventStream:
        """The stream, its first token at ``first_token``, one token every ``interval``."""

    def billed(self, finished: float) -> None:
        """The generation finished and was billed at ``finished``."""

    def body(self, finished: float) -> bytes:
        """The JSON answer of a generation that finished at ``finished``."""

    def died(self) -> None:
        """The provider died mid-stream: nothing finished."""


@dataclass(frozen=True, slots=True)
class _Rendered:
    """A :class:`Reply` rendered from the ask alone (every endpoint but ``/v1/responses``)."""

    endpoint: Endpoint
    ask: Ask
    request_id: str

    def events(self, first_token: float, interval: float) -> EventStream:
        assert self.endpoint.stream is not None  # parsers only set ask.stream where it streams
        return self.endpoint.stream(self.ask, self.request_id, int(first_token))

    def billed(self, finished: float) -> None:
        pass

    def body(self, finished: float) -> bytes:
        assert self.endpoint.render is not None
        return self.endpoint.render(self.ask, self.request_id, int(finished))

    def died(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A request that was neither refused nor malformed, sized and with its latency drawn."""

    request_id: str
    key: tuple[str, str]  # (api key id, project or workspace id), from the credential
    overrides: Overrides
    ask: Ask
    delay: float  # seconds: the generation, or a stream's time to first token
    arrived: float  # the simulator's clock when the request came in


# Whole, streamed, stored and background answers: see payonce.sim.responses.
RESPONSES = Endpoint("/v1/responses", Api.OPENAI, "resp_", parse_responses)
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
    RESPONSES,
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
        self._keep_alive = config.keep_alive
        self._wire = config.wire
        self.responses = StoredResponses(config.stored_responses)
        self._background_tasks: set[asyncio.Task[None]] = set()

    def new_request_id(self, prefix: str) -> str:
        """A provider request id such as ``chatcmpl-<24 hex digits>``."""
        return f"{prefix}{self._ids.getrandbits(96):024x}"

    async def generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """Handle one request to ``endpoint`` (the steps in the module docstring)."""
        admitted = await self._admit(request, endpoint)
        if isinstance(admitted, web.Response):
            return admitted
        ask, request_id = admitted.ask, admitted.request_id
        if isinstance(ask, ResponsesAsk) and ask.background and not ask.stream:
            return self._background(request, endpoint, admitted, ask)
        reply = self._reply(endpoint, admitted)
        self.ledger.generating += 1
        try:
            if ask.stream:
                return await self._stream(request, endpoint, admitted, reply)
            if admitted.delay > 0:
                # aiohttp runs handlers with handler_cancellation=False, so this sleep (the
                # generation) runs to the end even if the client disconnects meanwhile.
                await asyncio.sleep(admitted.delay)
            now = self._bill(endpoint, ask, request_id, admitted.key, client_connected(request))
            reply.billed(now)
        finally:
            self.ledger.generating -= 1
        if self._drop(admitted.overrides):
            return drop_connection(request)
        body = reply.body(now)
        wire = admitted.overrides.wire or self._wire
        if wire.profile.stated_cost:  # openrouter: the usage states the call's cost
            body = with_cost(body, cost_usd(ask.model, ask.input_tokens, ask.output_tokens))
        response = json_response(body, 200, endpoint.api, request_id)
        if admitted.overrides.no_request_id:
            hide_request_id(response)
        return response

    async def close(self) -> None:
        """Stop the background generations still running (unfinished: never billed)."""
        tasks = list(self._background_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _admit(self, request: web.Request, endpoint: Endpoint) -> _Admitted | web.Response:
        """Count the request, refuse it (a fault or a bad body) or size it and draw its latency."""
        self.ledger.count_request()
        arrived = self.clock.now()
        request_id = self.new_request_id(endpoint.id_prefix)
        anthropic = endpoint.api is Api.ANTHROPIC
        key = credential_ids(credential_of(request.headers), anthropic=anthropic)
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
            return json_response(body, 400, endpoint.api, request_id)
        delay = overrides.delay
        if delay is None:
            delay = self._latency.sample(self._rng)
        return _Admitted(request_id, key, overrides, ask, delay, arrived)

    def _reply(self, endpoint: Endpoint, admitted: _Admitted) -> Reply:
        ask = admitted.ask
        if isinstance(ask, ResponsesAsk):
            created = ResponseObject(ask, admitted.request_id, int(admitted.arrived))
            kept = ask.store or ask.background
            project = admitted.key[1]
            return ResponseReply(created, self.responses if kept else None, project)
        return _Rendered(endpoint, ask, admitted.request_id)

    def _background(
        self, request: web.Request, endpoint: Endpoint, admitted: _Admitted, ask: ResponsesAsk
    ) -> web.Response:
        """``background: true``: answer ``queued`` at once, generate and bill afterwards."""
        created = ResponseObject(ask, admitted.request_id, int(admitted.arrived))
        queued = created.render("queued")
        self.responses.add(created.id, admitted.key[1], queued)
        task = asyncio.get_running_loop().create_task(
            self._generate_in_background(endpoint, admitted, created)
        )
        self._background_tasks.add(task)
        task.add_done_callback(self._background_tasks.discard)
        if self._drop(admitted.overrides):
            # Queued (and billed when it finishes), but the client never learns its id.
            return drop_connection(request)
        response = json_response(queued, 200, endpoint.api, created.id)
        if admitted.overrides.no_request_id:
            hide_request_id(response)
        return response

    async def _generate_in_background(
        self, endpoint: Endpoint, admitted: _Admitted, created: ResponseObject
    ) -> None:
        await asyncio.sleep(0)  # the answer (queued) goes out first
        self.responses.update(created.id, created.render("in_progress"))
        self.ledger.generating += 1
        try:
            if admitted.delay > 0:
                await asyncio.sleep(admitted.delay)
            # Nobody waits on a background generation: the answer waits to be fetched.
            now = self._bill(endpoint, created.ask, created.id, admitted.key, connected=False)
        finally:
            self.ledger.generating -= 1
        self.responses.update(created.id, created.finished(int(now)))

    async def _stream(
        self, request: web.Request, endpoint: Endpoint, admitted: _Admitted, reply: Reply
    ) -> web.StreamResponse:
        """Answer as server-sent events (the stream steps in the module docstring)."""
        overrides, request_id = admitted.overrides, admitted.request_id
        interval = overrides.token_interval
        if interval is None:
            interval = self._token_interval
        keep_alive = overrides.keep_alive
        if keep_alive is None:
            keep_alive = self._keep_alive
        wire = overrides.wire or self._wire

        response = web.StreamResponse(
            headers={"Cache-Control": "no-cache", REQUEST_ID_HEADER: request_id}
        )
        if endpoint.api is Api.ANTHROPIC:
            response.headers[ANTHROPIC_REQUEST_ID_HEADER] = request_id
        for name in wire.profile.headers:
            response.headers[name] = request_id
        if overrides.no_request_id or not wire.profile.request_id_header:
            hide_request_id(response)
        response.content_type = EVENT_STREAM
        response.charset = "utf-8"
        sender = EventSender(request, response, trickle=wire.trickle, framing=wire.framing)
        loop = asyncio.get_running_loop()

        def comment() -> bytes | None:
            return wire.comment(self.clock.now())

        if keep_alive > 0:
            # As OpenRouter does: the head at once, then comments while the model thinks.
            await sender.start()
            now = loop.time()
            await _pause(sender, now, now + admitted.delay, keep_alive, comment)
        elif admitted.delay > 0:
            await asyncio.sleep(admitted.delay)  # the time to first token

        events = reply.events(self.clock.now(), interval)
        last = events.count - 1  # the terminating event
        die_at = self._die_point(overrides, events.count)
        drop = die_at is None and self._drop(overrides)
        if keep_alive <= 0:
            await sender.start()

        shaped = not wire.plain
        # The call's own cost, in the usage of a profile that states it (openrouter).
        ask = admitted.ask
        cost = (
            cost_usd(ask.model, ask.input_tokens, ask.output_tokens)
            if wire.profile.stated_cost
            else None
        )
        first_token = len(events.head) if events.tokens else -1
        pings = wire.profile.ping_every if endpoint.api is Api.ANTHROPIC else 0
        due = loop.time()
        for index in range(events.count):
            if index == first_token and wire.profile.comment_first:
                await sender.send(comment() or b"")
            if interval > 0 and events.is_token(index):
                due += interval
                await sender.flush()  # what is due now goes out before the wait
                await _pause(sender, due - interval, due, keep_alive, comment)
            if index == die_at:
                reply.died()
                error = wire.error_event(request_id, admitted.ask.model)
                if error is None:
                    await sender.close()
                else:  # the error in the stream, and a clean end of the body
                    await sender.send(error)
                    await sender.finish()
                return response
            if index == last:
                connected = sender.connected and client_connected(request)
                now = self._bill(endpoint, admitted.ask, request_id, admitted.key, connected)
                reply.billed(now)
                if drop:
                    await sender.close()
                    return response
            event = events.event(index)
            if shaped:
                event = _shaped(
                    wire, event, request_id, index, index == first_token, index == last, cost
                )
            await sender.send(event)
            if pings and events.is_token(index) and (index - len(events.head) + 1) % pings == 0:
                await sender.send(wire.frame(PING))
        await sender.finish()
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
        response = json_response(error_body(api, status), status, api, request_id)
        if status in RETRY_AFTER_STATUSES:
            response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response


async def _pause(
    sender: EventSender,
    since: float,
    until: float,
    keep_alive: float,
    comment: Callable[[], bytes | None],
) -> None:
    """Wait until ``until`` (the loop's clock), with a keep-alive ``comment()`` every
    ``keep_alive`` seconds after ``since`` (none when 0, or when the wire has none).

    The comments are counted from ``since``, not from when the wait began, so a
    wait of a given length carries the same number of them on a slow machine.
    """
    loop = asyncio.get_running_loop()
    if keep_alive > 0:
        # Tick n is since + n * keep_alive, compared with a microsecond's slack:
        # adding 0.1 five times to a clock reading can land a hair before
        # since + 0.5 and send one comment too many.
        count = 1
        while since + count * keep_alive < until - 1e-6:
            await asyncio.sleep(since + count * keep_alive - loop.time())
            text = comment()
            if text:
                await sender.send(text)
                await sender.flush()
            count += 1
    await asyncio.sleep(until - loop.time())


def _shaped(
    wire: Wire,
    event: bytes,
    request_id: str,
    index: int,
    first: bool,
    last: bool,
    cost: float | None = None,
) -> bytes:
    """One event as ``wire`` sends it (``b""``: not sent at all)."""
    event = wire.shape(event, request_id, index, cost)
    if not event:
        return event
    if first and wire.event_bytes:
        event = wire.pad(event)
    return wire.last(event) if last else wire.frame(event)


async def _read_json(request: web.Request) -> object:
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        # JSONDecodeError and UnicodeDecodeError are ValueErrors; RecursionError is a
        # body nested deeper than the json module reads ([[[[...]]]] 1,000 levels on).
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
