"""OpenAI's Responses API (``/v1/responses``): the response object in each state, and its stream.

A request is sized like any other (:func:`~payonce.sim.prompts.parse_responses`) and
answered with one ``message`` output item holding one ``output_text`` part: the same
text as a chat completion of the same size. The object, in OpenAI's key order::

    {"id":"resp_…","object":"response","created_at":…,"status":"completed",
     "background":false,"completed_at":…,"error":null,"incomplete_details":null,
     "instructions":null,"max_output_tokens":null,"max_tool_calls":null,"model":…,
     "output":[{"type":"message","id":"msg_…","status":"completed","role":"assistant",
                "content":[{"type":"output_text","text":…,"annotations":[],"logprobs":[]}]}],
     "parallel_tool_calls":true,"previous_response_id":null,"prompt_cache_key":null,
     "reasoning":{"effort":null,"summary":null},"safety_identifier":null,
     "service_tier":"default","store":true,"temperature":1.0,
     "text":{"format":{"type":"text"},"verbosity":"medium"},"tool_choice":"auto",
     "tools":[],"top_logprobs":0,"top_p":1.0,"truncation":"disabled",
     "usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":0,
              "cache_write_tokens":0},"output_tokens":16,
              "output_tokens_details":{"reasoning_tokens":0},"total_tokens":24},
     "user":null,"metadata":{}}

``max_output_tokens`` cutting the answer short makes it ``incomplete`` (the message
too) with ``incomplete_details: {"reason": "max_output_tokens"}``. Before it finishes
a response is ``queued`` (background, just created) or ``in_progress``, with no
output, ``usage`` and ``completed_at`` null; a stream whose provider died is
``failed`` with ``error: {"code": "server_error", …}``. Cached and reasoning tokens
are always 0 (not modelled).

Streamed (``"stream": true``), each event is ``event: <type>`` then ``data: <json>``
whose first fields are ``type`` and ``sequence_number`` (0, 1, …); there is no
``[DONE]``: the stream ends after its last event::

    response.created               {"response": <object, in_progress>}
    response.in_progress           {"response": <object, in_progress>}
    response.output_item.added     {"output_index":0,"item":<message, in_progress, no content>}
    response.content_part.added    {"item_id","output_index":0,"content_index":0,
                                    "part":{"type":"output_text","text":"",…}}
    response.output_text.delta     {"item_id",…,"delta":"This","logprobs":[]}  (one per token)
    response.output_text.done      {"item_id",…,"text":<the whole text>,"logprobs":[]}
    response.content_part.done     {"item_id",…,"part":<the whole part>}
    response.output_item.done      {"output_index":0,"item":<the whole message>}
    response.completed             {"response": <object, completed, with usage>}
                                   (response.incomplete when max_output_tokens cut it)

The message id is the response id's with a ``msg_`` prefix, so a stored response and
its stream agree without storing more than the response id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from payonce.sim.bodies import answer_text
from payonce.sim.prompts import ResponsesAsk
from payonce.sim.response_store import StoredResponses
from payonce.sim.streams import TOKEN_PIECES, EventStream

__all__ = ["DIED_MESSAGE", "ResponseObject", "ResponseReply", "Status"]

Status = str  # "queued", "in_progress", "completed", "incomplete", "failed"

DIED_MESSAGE = "The model stopped while generating this response (simulated by payonce sim)."
_TEXT_FORMAT = {"format": {"type": "text"}, "verbosity": "medium"}
_REASONING = {"effort": None, "summary": None}


@dataclass(frozen=True, slots=True)
class ResponseObject:
    """One response: what was asked, its id and when it was created (epoch seconds)."""

    ask: ResponsesAsk
    id: str
    created_at: int

    @property
    def message_id(self) -> str:
        return "msg_" + self.id.removeprefix("resp_")

    @property
    def final_status(self) -> Status:
        """How the generation ends: ``incomplete`` when ``max_output_tokens`` cut it."""
        return "incomplete" if self.ask.truncated else "completed"

    def render(self, status: Status, completed_at: int | None = None) -> bytes:
        """The object as ``GET /v1/responses/{id}`` answers it in ``status``."""
        return orjson.dumps(self._document(status, completed_at))

    def finished(self, completed_at: int) -> bytes:
        """The object once generated (``completed`` or ``incomplete``)."""
        return self.render(self.final_status, completed_at)

    def stream(self, completed_at: int) -> EventStream:
        """The events of this response streamed, finishing at ``completed_at``."""
        started = self._document("in_progress", None)
        finished = self._document(self.final_status, completed_at)
        item_started = _message(self.message_id, "in_progress", [])
        [item] = finished["output"]
        [part] = item["content"]
        empty_part = {**part, "text": ""}
        ids = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        head = (
            _event("response.created", 0, {"response": started}),
            _event("response.in_progress", 1, {"response": started}),
            _event("response.output_item.added", 2, {"output_index": 0, "item": item_started}),
            _event("response.content_part.added", 3, {**ids, "part": empty_part}),
        )
        tokens = self.ask.output_tokens
        after = len(head) + tokens
        tail = (
            _event(
                "response.output_text.done",
                after,
                {**ids, "text": part["text"], "logprobs": []},
            ),
            _event("response.content_part.done", after + 1, {**ids, "part": part}),
            _event("response.output_item.done", after + 2, {"output_index": 0, "item": item}),
            _event(f"response.{self.final_status}", after + 3, {"response": finished}),
        )
        kind = b"response.output_text.delta"
        opener = b'event: %s\ndata: {"type":"%s","sequence_number":' % (kind, kind)
        middle = b',"item_id":%s,"output_index":0,"content_index":0,"delta":' % orjson.dumps(
            self.message_id
        )
        closer = b',"logprobs":[]}\n\n'
        first = len(head)

        def token(i: int) -> bytes:
            return b"".join((opener, b"%d" % (first + i), middle, TOKEN_PIECES[i], closer))

        return EventStream(head=head, tokens=tokens, token=token, tail=tail)

    def _document(self, status: Status, completed_at: int | None) -> dict[str, Any]:
        ask = self.ask
        done = status in ("completed", "incomplete")
        output: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        if done:
            part = {
                "type": "output_text",
                "text": answer_text(ask.answer_tokens),
                "annotations": [],
                "logprobs": [],
            }
            output.append(_message(self.message_id, status, [part]))
            usage = {
                "input_tokens": ask.input_tokens,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": ask.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": ask.input_tokens + ask.output_tokens,
            }
        error = None
        if status == "failed":
            error = {"code": "server_error", "message": DIED_MESSAGE}
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": ask.background,
            "completed_at": completed_at if done else None,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": ask.instructions,
            "max_output_tokens": ask.max_output_tokens,
            "max_tool_calls": None,
            "model": ask.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": ask.previous_response_id,
            "prompt_cache_key": None,
            "reasoning": _REASONING,
            "safety_identifier": None,
            "service_tier": "default",
            "store": ask.store,
            "temperature": 1.0 if ask.temperature is None else ask.temperature,
            "text": _TEXT_FORMAT,
            "tool_choice": "auto",
            "tools": [],
            "top_logprobs": 0,
            "top_p": 1.0 if ask.top_p is None else ask.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": ask.user or None,
            "metadata": dict(ask.metadata),
        }


class ResponseReply:
    """How the simulator answers one ``/v1/responses`` request, keeping its stored copy current.

    ``store`` is ``None`` for ``"store": false``. The stored copy is ``in_progress`` from
    the start, then what the answer said: a stream's ``response.completed`` object
    (with the ``completed_at`` it was streamed with), or the JSON body; ``failed`` if the
    provider died mid-stream.
    """

    def __init__(self, created: ResponseObject, store: StoredResponses | None, project: str):
        self.created = created
        self._store = store
        self._completed_at: int | None = None  # set once a stream was planned
        self._final = b""
        if store is not None:
            store.add(created.id, project, created.render("in_progress"))

    def events(self, first_token: float, interval: float) -> EventStream:
        # The last event is built before the first is sent: it says when the paced
        # stream is due to finish.
        self._completed_at = int(first_token + self.created.ask.output_tokens * interval)
        return self.created.stream(self._completed_at)

    def billed(self, finished: float) -> None:
        completed_at = self._completed_at if self._completed_at is not None else int(finished)
        self._final = self.created.finished(completed_at)
        if self._store is not None:
            self._store.update(self.created.id, self._final)

    def body(self, finished: float) -> bytes:
        return self._final or self.created.finished(int(finished))

    def died(self) -> None:
        if self._store is not None:
            self._store.update(self.created.id, self.created.render("failed"))


def _message(message_id: str, status: Status, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": message_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _event(kind: str, sequence: int, fields: dict[str, Any]) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": sequence, **fields})
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), data)
