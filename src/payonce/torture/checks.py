"""The invariants of docs/guarantees.md, checked against one run's history.

The history is what the clients saw (:class:`~payonce.torture.driver.Observation`),
what the upstream billed (the simulator's ledger: one entry per finished
generation, tagged with the business request's key as its end user), what each
gateway's call log says, the status endpoint's answer for every key at the end,
and the gateways' memory. Each check returns the violations it found; a double
bill that a fault explains is not a violation but is counted, with the fault.
"""

from __future__ import annotations

import datetime
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from payonce.observe.metrics import status_class
from payonce.torture.driver import Observation, complete_events_end
from payonce.torture.excuses import (
    arrival,
    expired,
    explains,
    faults_during,
    held_together,
    record_lives,
)
from payonce.torture.nemesis import Played
from payonce.torture.plan import Call

__all__ = ["Answer", "History", "Violation", "check", "read_answer"]

# Invariant names, as docs/guarantees.md lists them.
BILLED_ONCE = "billed-once"
WHOLE_ANSWERS = "whole-answers"
REPLAY_EQUALS_FIRST = "replay-equals-first"
NO_STUCK_KEYS = "no-stuck-keys"
CALL_LOG = "call-log-tells-the-truth"
KEY_REUSE = "key-reuse-refused"
RSS_BOUNDED = "memory-bounded"
METRICS = "metrics-match-call-log"
RECONCILE = "reconcile-tells-the-truth"
STORE_HIDDEN = "store-details-hidden"
STATUS = "status-tells-the-truth"
INVARIANTS = (
    BILLED_ONCE,
    WHOLE_ANSWERS,
    REPLAY_EQUALS_FIRST,
    NO_STUCK_KEYS,
    CALL_LOG,
    KEY_REUSE,
    RSS_BOUNDED,
    METRICS,
    RECONCILE,
    STORE_HIDDEN,
    STATUS,
)
RSS_LIMIT = 1024 * 1024 * 1024

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: which, about what, and the calls involved."""

    invariant: str
    detail: str
    key: str | None = None
    calls: tuple[int, ...] = ()

    def __str__(self) -> str:
        about = f" key {self.key}" if self.key else ""
        calls = f" (calls {', '.join(map(str, self.calls))})" if self.calls else ""
        return f"{self.invariant}:{about}{calls}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer as a client reads it: its generation's id(s), its text, how it ended."""

    ids: frozenset[str]
    text: str
    terminated: bool  # [DONE] / message_stop seen (whole answers: always)
    failed: bool  # the upstream's error inside a 200 (an error event or chunk)


@dataclass
class History:
    """Everything one run recorded, for the checks."""

    observations: list[Observation]
    played: list[Played]
    ledger: list[dict[str, Any]]
    call_log: list[dict[str, Any]]
    statuses: dict[str, dict[str, Any]]  # key -> status document at the end
    expected: dict[tuple[str, int], str]  # (api, prompt) -> the answer's text
    rss: dict[str, int | None]
    killed_gateways: frozenset[int] = field(default_factory=frozenset)
    # Gateway number -> its call log's lines, and its payonce_requests_total by
    # (outcome, status class), for each gateway that ran as one process throughout
    # (a restart starts its counters from zero while its call log goes on).
    gateway_lines: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    request_metrics: dict[int, dict[tuple[str, str], float]] = field(default_factory=dict)
    # `payonce reconcile --json -` of the run's call logs against its ledger (None:
    # not run, as when payonce[reconcile] is not installed; the runner says so).
    reconciled: dict[str, Any] | None = None
    # What would tell a caller where the store is: its address or file (defect 8).
    store_marks: tuple[str, ...] = ()
    store: str = "sqlite"  # the store kind: a full disk stops SQLite's writes too
    ttl: float | None = None  # the gateways' --ttl, when the run set a short one
    # gateway -> key -> its status endpoint's `replays`, once every count was flushed.
    replays: dict[int, dict[str, int]] = field(default_factory=dict)
    excused: list[str] = field(default_factory=list)  # double bills a fault explains


def _events(body: bytes) -> Iterable[tuple[str, bytes]]:
    """(event type, data) of each event of an SSE body, per WHATWG's reading."""
    kind, data = "message", list[bytes]()
    for line in _LINE_BREAK.split(body):
        if not line:
            if data:
                yield kind, b"\n".join(data)
            kind, data = "message", []
            continue
        name, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if name == b"event":
            kind = value.decode(errors="replace")
        elif name == b"data":
            data.append(value)
    if data:
        yield kind, b"\n".join(data)


def empty_sdk_events(body: bytes) -> int:
    """Events the official openai SDK would decode with empty data, and fail on.

    Its decoder (Stainless's ``SSEDecoder``) dispatches an event at a blank line
    when the block set ``event``, ``data`` or ``retry``, or when any earlier block
    set an ``id`` (it keeps the last one): a comment block numbered by the gateway,
    or a bare comment after a numbered event, becomes an event with data ``""``,
    and ``json.loads("")`` raises on it, on the first call and on every replay.
    """
    count, last_id = 0, False
    event = retry = False
    data: list[bytes] | None = None
    # The last piece is what follows the last line break: no line yet.
    for line in _LINE_BREAK.split(body)[:-1]:
        if not line:
            dispatched = event or data is not None or retry or last_id
            if dispatched and not b"".join(data or []):
                count += 1
            if data is not None and b"".join(data).startswith(b"[DONE]"):
                break  # the SDK reads no further
            event = retry = False
            data = None
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if name == b"id":
            last_id = True
        elif name == b"event":
            event = True
        elif name == b"retry":
            retry = True
        elif name == b"data":
            data = [*(data or []), value.removeprefix(b" ")]
    return count


def read_answer(
    api: str, stream: bool, body: bytes, upstream_id: str | None = None
) -> Answer | None:
    """The answer in ``body``; ``None`` when it is not one (not JSON, not events).

    An embeddings list has no id (OpenAI's has none): its generation is the
    ``upstream_id`` its response came with (``x-request-id``), and its text says
    how many vectors it holds, all of one length (``"3 vectors"``).
    """
    if not stream:
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if api == "embeddings":
            return _embeddings(document, upstream_id)
        if not isinstance(document, dict) or not isinstance(document.get("id"), str):
            return None
        if api == "messages":
            text = "".join(
                block.get("text", "")
                for block in document.get("content", [])
                if isinstance(block, dict)
            )
        else:
            choices = document.get("choices") or [{}]
            text = (choices[0].get("message") or {}).get("content") or ""
        return Answer(frozenset([document["id"]]), text, True, False)
    ids: set[str] = set()
    pieces: list[str] = []
    terminated = failed = False
    for kind, data in _events(body):
        if data == b"[DONE]":
            terminated = True
            continue
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            failed = True
            continue
        if not isinstance(document, dict):
            continue
        if (
            kind == "error"
            or document.get("type") == "error"
            or isinstance(document.get("error"), dict)
        ):
            failed = True
            continue
        if api == "messages":
            if document.get("type") == "message_start":
                ids.add(str(document["message"]["id"]))
            elif document.get("type") == "content_block_delta":
                pieces.append(document["delta"].get("text", ""))
            elif document.get("type") == "message_stop":
                terminated = True
            continue
        ids.add(str(document.get("id")))
        for choice in document.get("choices") or []:
            if choice.get("finish_reason") == "error":
                failed = True
            pieces.append((choice.get("delta") or {}).get("content") or "")
    return Answer(frozenset(ids), "".join(pieces), terminated, failed)


def _embeddings(document: Any, upstream_id: str | None) -> Answer | None:
    if not isinstance(document, dict) or upstream_id is None:
        return None
    data = document.get("data")
    if not isinstance(data, list):
        return None
    vectors = {item.get("embedding") for item in data if isinstance(item, dict)}
    lengths = {len(vector) for vector in vectors if isinstance(vector, str)}
    text = f"{len(data)} vectors" if len(lengths) == 1 else f"ragged: lengths {sorted(lengths)}"
    return Answer(frozenset([upstream_id]), text, True, False)


def _answer(observation: Observation, by_number: Mapping[int, Observation]) -> Answer | None:
    """The answer a client has after ``observation`` (a resume with its original's part)."""
    call = observation.call
    return read_answer(
        call.api, call.stream, _as_read(observation, by_number), observation.upstream_id
    )


def _by_key(observations: Iterable[Observation]) -> dict[str, list[Observation]]:
    keyed: dict[str, list[Observation]] = defaultdict(list)
    for observation in observations:
        if observation.call.key is not None:
            keyed[observation.call.key].append(observation)
    return keyed


def _window(observations: list[Observation]) -> tuple[float, float]:
    starts = [o.started for o in observations if o.started or o.ended]
    ends = [o.ended or o.started for o in observations]
    return (min(starts, default=0.0), max(ends, default=0.0))


# A response the gateway finished this long after its client hung up was not
# received whole: before that, the rest may have been in the client's socket
# buffer when it left (TCP cannot tell the gateway otherwise).
_LEFT_SLACK = 0.5


def _finished_after(line: Mapping[str, Any], left_at: float) -> bool:
    """Whether the call log says the response finished well after the client left."""
    stamp = line.get("ts")
    if not isinstance(stamp, str):
        return True
    finished = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return finished > left_at + _LEFT_SLACK


def _as_read(observation: Observation, by_number: Mapping[int, Observation]) -> bytes:
    """The stream a client has after ``observation``: a resume continues its original's
    whole events (``Last-Event-ID``), so both together must read as one answer."""
    if observation.call.resume_of is None:
        return observation.body
    original = by_number[observation.call.resume_of].body
    return original[: complete_events_end(original)] + observation.body


def _answered_before(
    observations: list[Observation], later: Observation, by_number: Mapping[int, Observation]
) -> bool:
    """Whether a call of the key got its whole answer before ``later`` was sent: then
    the key is completed, and a different body with it must be refused."""
    for o in observations:
        if o.status != 200 or not o.clean or o.left or o.call.mismatch:
            continue
        answer = _answer(o, by_number)
        whole = answer is not None and answer.terminated and not answer.failed
        if whole and o.ended < later.started:
            return True
    return False


def check(history: History, *, lease: float) -> list[Violation]:
    """Every invariant over ``history``; the double bills faults explain go to ``excused``."""
    violations: list[Violation] = []
    bills: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in history.ledger:
        bills[str(entry.get("user", ""))].append(entry)
    keyed = _by_key(history.observations)
    excused: set[str] = set()  # keys a fault let run twice: two answers may differ
    renewed: set[str] = set()  # keys whose record expired and began again
    by_number = {o.call.number: o for o in history.observations}

    # billed-once: at most one generation per key, unless a fault explains the second.
    for key, observations in keyed.items():
        count = len(bills.get(key, []))
        lives = record_lives(observations, bills.get(key, []), history.ttl, history.played)
        if lives > 1:
            excused.add(key)  # answers of two lives differ, as they should
            renewed.add(key)
        if count <= lives:
            continue
        start, end = _window(observations)
        served = {o.call.gateway for o in observations}
        during = faults_during(history.played, start, end, slack=3 * lease)
        faults = [p for p in during if explains(p, served, lease, history.store)]
        faults = faults or held_together(during, served, lease, history.store)
        numbers = tuple(o.call.number for o in observations)
        if faults:
            kinds = ", ".join(f"{p.fault.kind}#{p.fault.number}" for p in faults)
            history.excused.append(f"key {key}: billed {count}, owed to {kinds}")
            excused.add(key)
        else:
            violations.append(
                Violation(BILLED_ONCE, f"billed {count} times, no fault", key, numbers)
            )

    def bad(invariant: str, detail: str, call: Call) -> None:
        violations.append(Violation(invariant, detail, call.key, (call.number,)))

    # whole-answers, replay-equals-first, key-reuse-refused
    billed_ids = {str(entry.get("provider_request_id")) for entry in history.ledger}
    for observation in history.observations:
        call = observation.call
        if call.mismatch:
            if call.key in renewed:
                continue  # its record expired, and a later life may have been released
            if history.ttl is not None and expired(
                arrival(observation, history.played), bills.get(call.key or "", []), history.ttl
            ):
                continue  # the record was gone: a new request may use the key
            if observation.status == 200 and _answered_before(
                keyed[call.key or ""], observation, by_number
            ):
                violations.append(
                    Violation(
                        KEY_REUSE, "a different body with the key got 200", call.key, (call.number,)
                    )
                )
            continue
        if observation.status != 200 or not observation.clean or observation.left:
            continue
        answer = _answer(observation, by_number)
        where = (call.number,)
        if answer is None:
            bad(WHOLE_ANSWERS, "a 200 that is no answer", call)
            continue
        if answer.failed:
            continue  # the upstream's own error, relayed as it came: the client sees it
        if call.stream and call.api == "chat":
            empty = empty_sdk_events(_as_read(observation, by_number))
            if empty:
                bad(WHOLE_ANSWERS, f"{empty} events the openai SDK decodes as empty", call)
                continue
        if not answer.terminated:
            violations.append(
                Violation(
                    WHOLE_ANSWERS, "a stream ended cleanly without its end event", call.key, where
                )
            )
            continue
        if len(answer.ids) != 1:
            violations.append(
                Violation(
                    WHOLE_ANSWERS, f"one answer from {len(answer.ids)} generations", call.key, where
                )
            )
            continue
        if call.api == "embeddings":
            expected = f"{call.inputs} vectors"
        else:
            expected = history.expected[(call.api, call.prompt)]
        if answer.text != expected:
            bad(WHOLE_ANSWERS, "the text is not the generation's", call)
        if not answer.ids <= billed_ids:
            violations.append(
                Violation(
                    WHOLE_ANSWERS, f"generation {set(answer.ids)} was never billed", call.key, where
                )
            )
    for key, observations in keyed.items():
        if key in excused:
            continue
        seen: dict[frozenset[str], int] = {}
        for observation in observations:
            call = observation.call
            if call.mismatch or observation.status != 200 or not observation.clean:
                continue
            answer = _answer(observation, by_number)
            if answer is None or answer.failed or not answer.terminated:
                continue
            seen.setdefault(answer.ids, call.number)
        if len(seen) > 1:
            violations.append(
                Violation(
                    REPLAY_EQUALS_FIRST,
                    f"{len(seen)} different generations answered one key",
                    key,
                    tuple(seen.values()),
                )
            )

    # no-stuck-keys: nothing in progress once every fault is undone and leases lapsed.
    for key, document in history.statuses.items():
        if document.get("state") == "in_progress":
            violations.append(Violation(NO_STUCK_KEYS, "still in_progress at the end", key))

    # status-tells-the-truth: the replays a key's status counts are the answers its
    # record served (call-log lines "replayed"; "joined" ones too when they followed
    # another gateway's recording, which the line does not tell from an in-process join).
    violations.extend(_status_violations(history, keyed, renewed))

    # call-log-tells-the-truth: one line per answered request, with the status seen.
    lines: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for line in history.call_log:
        lines[str(line.get("request_id"))].append(line)
    for observation in history.observations:
        call = observation.call
        if observation.request_id is None or call.gateway in history.killed_gateways:
            continue
        found = lines.get(observation.request_id, [])
        if len(found) != 1:
            violations.append(
                Violation(
                    CALL_LOG,
                    f"{len(found)} lines for request {observation.request_id}",
                    call.key,
                    (call.number,),
                )
            )
            continue
        status = found[0].get("status")
        if observation.left and status != 499 and _finished_after(found[0], observation.left_at):
            violations.append(
                Violation(
                    CALL_LOG, f"the client left, the line says {status}", call.key, (call.number,)
                )
            )
        elif observation.clean and not observation.left and status != observation.status:
            violations.append(
                Violation(
                    CALL_LOG,
                    f"the client got {observation.status}, the line says {status}",
                    call.key,
                    (call.number,),
                )
            )

    # metrics-match-call-log: a gateway's request counters say what its call log says.
    for number, counted in history.request_metrics.items():
        logged: dict[tuple[str, str], float] = defaultdict(float)
        for line in history.gateway_lines.get(number, []):
            logged[(str(line.get("outcome")), status_class(int(line.get("status") or 0)))] += 1
        differ = {
            name: (logged.get(name, 0.0), counted.get(name, 0.0))
            for name in set(logged) | set(counted)
            if logged.get(name, 0.0) != counted.get(name, 0.0)
        }
        for (outcome, status), (lines_of, metric) in sorted(differ.items()):
            violations.append(
                Violation(
                    METRICS,
                    f"gateway {number}: {lines_of:.0f} call-log lines {outcome} {status},"
                    f" payonce_requests_total says {metric:.0f}",
                )
            )

    # reconcile-tells-the-truth: the bill's figures as the ledger's tags give them.
    if history.reconciled is not None:
        violations.extend(_reconcile_violations(history))

    # store-details-hidden: callers get a stable problem type, never the store's address.
    marks = [mark.encode() for mark in history.store_marks if mark]
    for observation in history.observations:
        named = [mark for mark in marks if mark in observation.body]
        if named:
            bad(STORE_HIDDEN, f"the answer names the store ({named[0].decode()})", observation.call)

    # memory-bounded
    for name, rss in history.rss.items():
        if rss is not None and rss > RSS_LIMIT:
            violations.append(Violation(RSS_BOUNDED, f"{name} holds {rss / 2**20:.0f} MiB"))
    return violations


def _status_violations(
    history: History, keyed: Mapping[str, list[Observation]], renewed: set[str]
) -> list[Violation]:
    """Each gateway's status ``replays`` against the call logs, for keys whose record
    lived once (a new life starts from 0, while the call log holds both)."""
    found: list[Violation] = []
    outcomes: dict[str, list[str]] = defaultdict(list)
    for line in history.call_log:
        if isinstance(line.get("key"), str):
            outcomes[line["key"]].append(str(line.get("outcome")))
    for gateway, counts in sorted(history.replays.items()):
        for key, counted in sorted(counts.items()):
            if key in renewed:
                continue
            if any(o.call.gateway in history.killed_gateways for o in keyed.get(key, [])):
                continue  # a killed gateway's unflushed counts and lines are lost alike
            replayed = outcomes[key].count("replayed")
            joined = outcomes[key].count("joined")
            if not replayed <= counted <= replayed + joined:
                found.append(
                    Violation(
                        STATUS,
                        f"gateway {gateway}'s status counts {counted} replays, the call logs"
                        f" {replayed} replayed and {joined} joined answers",
                        key,
                    )
                )
    return found


def _reconcile_violations(history: History) -> list[Violation]:
    """Reconcile's totals against the truth the ledger's tags tell.

    Every generation is tagged with its business request (the key, or one tag per
    unkeyed call), so the truth is known: generations billed, and duplicates
    (each generation of a business request beyond its first). Reconcile must
    count every bill line, and, when the call logs explain every line (no gateway
    was killed, so no line was lost), find exactly those duplicates.
    """
    found: list[Violation] = []
    report = history.reconciled or {}
    per_user: dict[str, int] = defaultdict(int)
    for entry in history.ledger:
        per_user[str(entry.get("user", ""))] += 1
    billed = len(history.ledger)
    duplicates = sum(count - 1 for count in per_user.values())
    if report.get("bill_lines") != billed:
        found.append(
            Violation(
                RECONCILE, f"{report.get('bill_lines')} bill lines read, the ledger has {billed}"
            )
        )
    unmatched = report.get("unmatched_bill_lines") or 0
    if unmatched and not history.killed_gateways:
        found.append(
            Violation(
                RECONCILE, f"{unmatched} bill lines no call-log line explains, no gateway killed"
            )
        )
    if not unmatched and report.get("duplicate_generations") != duplicates:
        found.append(
            Violation(
                RECONCILE,
                f"reconcile finds {report.get('duplicate_generations')} duplicate generations,"
                f" the ledger's tags {duplicates}",
            )
        )
    return found
