"""The torture checker's invariants find what they name, on histories built by hand.

Each case is one defect a review found (a splice, a truncation taken as whole, a
double bill, a key stuck in progress, a call log that lies): the check must
report it, and must excuse a double bill only when a fault explains it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

import pytest

from payonce.torture.checks import (
    BILLED_ONCE,
    CALL_LOG,
    KEY_REUSE,
    METRICS,
    NO_STUCK_KEYS,
    RECONCILE,
    REPLAY_EQUALS_FIRST,
    STATUS,
    STORE_HIDDEN,
    WHOLE_ANSWERS,
    History,
    check,
)
from payonce.torture.driver import Observation
from payonce.torture.nemesis import Played
from payonce.torture.plan import Call, Fault

TEXT = "Hello there."


def _chunk(generation: str, content: str) -> bytes:
    return b'data: {"id":"%s","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % (
        generation.encode(),
        content.encode(),
    )


def _stream(
    generation: str, *, done: bool = True, pieces: tuple[str, ...] = ("Hello", " there.")
) -> bytes:
    body = b"".join(_chunk(generation, piece) for piece in pieces)
    return body + (b"data: [DONE]\n\n" if done else b"")


def _seen(
    number: int, body: bytes, *, key: str = "k", gateway: int = 0, **fields: Any
) -> Observation:
    call = Call(number=number, at=0.0, gateway=gateway, key=key, stream=True, **fields)
    observation = Observation(call, started=number, ended=number + 0.5, status=200, body=body)
    observation.clean = True
    observation.request_id = f"r{number}"
    return observation


def _history(observations: list[Observation], bills: list[str], **fields: Any) -> History:
    ledger = [{"provider_request_id": g, "user": "k"} for g in bills]
    log = [
        {
            "request_id": o.request_id,
            "status": 499 if o.left else o.status,
            "ts": "2026-01-01T00:00:00Z",
        }
        for o in observations
    ]
    defaults: dict[str, Any] = {
        "observations": observations,
        "played": [],
        "ledger": ledger,
        "call_log": log,
        "statuses": {"k": {"state": "completed"}},
        "expected": {("chat", 0): TEXT},
        "rss": {},
    }
    return History(**{**defaults, **fields})


def _names(history: History) -> set[str]:
    return {violation.invariant for violation in check(history, lease=3.0)}


def test_a_run_that_kept_the_promise_passes() -> None:
    history = _history([_seen(0, _stream("g1")), _seen(1, _stream("g1"))], ["g1"])
    assert check(history, lease=3.0) == []


def test_two_bills_for_one_key_without_a_fault_are_a_violation() -> None:
    history = _history([_seen(0, _stream("g1")), _seen(1, _stream("g1"))], ["g1", "g2"])
    assert _names(history) == {BILLED_ONCE}


@pytest.mark.parametrize(
    ("fault", "excused"),
    [
        (Fault(0, 0.0, "kill", 1.0, target=0), True),
        (Fault(0, 0.0, "kill", 1.0, target=1), False),  # a gateway that never served the key
        (Fault(0, 0.0, "stop", 2.5, target=0), True),
        (Fault(0, 0.0, "stop", 1.0, target=0), False),  # shorter than 2/3 of the lease
        (Fault(0, 0.0, "stall", 3.5), True),
        (Fault(0, 0.0, "stall", 2.0), False),  # within the recorder's bound: one lease
        (Fault(0, 0.0, "term", 1.0, target=0), False),
        (Fault(0, 0.0, "disk", 2.5, target=0), True),  # SQLite cannot renew its lease
        (Fault(0, 0.0, "disk", 1.0, target=0), False),
    ],
)
def test_a_double_bill_is_excused_only_by_a_fault_that_explains_it(
    fault: Fault, excused: bool
) -> None:
    history = _history(
        [_seen(0, _stream("g1")), _seen(1, _stream("g1"))],
        ["g1", "g2"],
        played=[Played(fault, 0.2, 0.2 + fault.seconds)],
    )
    assert (_names(history) == set()) is excused
    assert bool(history.excused) is excused


def test_a_spliced_resume_is_two_generations_in_one_answer() -> None:
    first = _seen(0, _chunk("g1", "Hello") + b"id: 1-aaaaaaaa\n\n", leave_after=1)
    first.left, first.clean = True, False
    resumed = _seen(1, _chunk("g2", " there.") + b"data: [DONE]\n\n", resume_of=0)
    history = _history([first, resumed], ["g1", "g2"])
    assert WHOLE_ANSWERS in _names(history)


def test_a_stream_that_ended_cleanly_without_its_end_is_a_truncation() -> None:
    history = _history([_seen(0, _stream("g1", done=False, pieces=("Hello",)))], ["g1"])
    assert _names(history) == {WHOLE_ANSWERS}


def test_an_error_event_relayed_as_it_came_is_not_a_truncation() -> None:
    body = _chunk("g1", "Hel") + b'event: error\ndata: {"type":"error","error":{}}\n\n'
    history = _history([_seen(0, body)], [])
    assert check(history, lease=3.0) == []


def test_two_generations_answering_one_key_break_replay_equality() -> None:
    history = _history([_seen(0, _stream("g1")), _seen(1, _stream("g2"))], ["g1", "g2"])
    assert REPLAY_EQUALS_FIRST in _names(history)


def test_an_answer_whose_generation_was_never_billed_is_made_up() -> None:
    history = _history([_seen(0, _stream("g9"))], ["g1"])
    assert _names(history) == {WHOLE_ANSWERS}


def test_a_key_left_in_progress_is_stuck() -> None:
    history = _history([_seen(0, _stream("g1"))], ["g1"], statuses={"k": {"state": "in_progress"}})
    assert _names(history) == {NO_STUCK_KEYS}


def test_a_call_log_that_says_200_for_a_client_that_left_long_before_lies() -> None:
    left = _seen(0, _chunk("g1", "Hello"), leave_after=1)
    left.left, left.clean, left.left_at = True, False, 0.0
    history = _history([left, _seen(1, _stream("g1"))], ["g1"])
    history.call_log[0]["status"] = 200
    history.call_log[0]["ts"] = "2026-01-01T00:00:05Z"
    assert _names(history) == {CALL_LOG}


def test_a_missing_call_log_line_is_a_violation_unless_its_gateway_was_killed() -> None:
    observations = [_seen(0, _stream("g1"), gateway=1)]
    history = _history(observations, ["g1"], call_log=[])
    assert _names(history) == {CALL_LOG}
    assert (
        check(
            _history(observations, ["g1"], call_log=[], killed_gateways=frozenset({1})), lease=3.0
        )
        == []
    )


def test_a_different_body_with_a_completed_key_must_be_refused() -> None:
    first = _seen(0, _stream("g1"))
    changed = _seen(2, _stream("g2"), mismatch=True)
    assert KEY_REUSE in _names(_history([first, changed], ["g1", "g2"]))
    # Before any answer completed the key, the same key may start again.
    early = _seen(0, _stream("g1"))
    early.ended = 9.0
    assert KEY_REUSE not in _names(_history([early, changed], ["g1", "g2"]))


def test_request_counters_that_disagree_with_the_call_log_are_a_violation() -> None:
    seen = [_seen(1, _stream("g1")), _seen(2, _stream("g1"))]
    lines = [
        {"request_id": "r1", "outcome": "forwarded", "status": 200},
        {"request_id": "r2", "outcome": "replayed", "status": 499},
    ]
    agreeing = {("forwarded", "2xx"): 1.0, ("replayed", "499"): 1.0}
    history = _history(seen, ["g1"], gateway_lines={0: lines}, request_metrics={0: agreeing})
    assert METRICS not in _names(history)
    # A client that left counted as a 200 by the metrics (the call log's 499 is the truth).
    lying = {("forwarded", "2xx"): 1.0, ("replayed", "2xx"): 1.0}
    history = _history(seen, ["g1"], gateway_lines={0: lines}, request_metrics={0: lying})
    assert METRICS in _names(history)
    # A request counted that no line records.
    extra = {**agreeing, ("error", "5xx"): 1.0}
    history = _history(seen, ["g1"], gateway_lines={0: lines}, request_metrics={0: extra})
    assert METRICS in _names(history)


def test_reconcile_must_count_the_bill_and_its_duplicates_as_the_ledgers_tags_do() -> None:
    seen = [_seen(1, _stream("g1")), _seen(2, _stream("g1"))]
    truth = {"bill_lines": 1, "unmatched_bill_lines": 0, "duplicate_generations": 0}
    assert RECONCILE not in _names(_history(seen, ["g1"], reconciled=truth))
    # Two generations of one key (a kill explains them): one is a duplicate.
    played = [Played(Fault(1, 0.0, "kill", 1.0, target=0), 0.5, 1.5)]
    two = {"bill_lines": 2, "unmatched_bill_lines": 0, "duplicate_generations": 1}
    history = _history(seen, ["g1", "g2"], reconciled=two, played=played)
    assert RECONCILE not in _names(history)
    missed = {**two, "duplicate_generations": 0}
    history = _history(seen, ["g1", "g2"], reconciled=missed, played=played)
    assert RECONCILE in _names(history)
    # A bill line nothing explains, while every call-log line was kept.
    unexplained = {**two, "unmatched_bill_lines": 1, "duplicate_generations": 0}
    history = _history(seen, ["g1", "g2"], reconciled=unexplained, played=played)
    assert RECONCILE in _names(history)
    # ... which a killed gateway's lost lines excuse.
    history = _history(
        seen, ["g1", "g2"], reconciled=unexplained, played=played, killed_gateways=frozenset({0})
    )
    assert RECONCILE not in _names(history)


def test_a_numbered_comment_breaks_the_openai_sdk_and_the_check_says_so() -> None:
    # Issue 29, defect 5: the gateway numbered comment blocks ("id: 2\n: ping\n\n").
    numbered = _chunk("g1", "Hello") + b"id: 2\n: ping\n\n" + _chunk("g1", " there.")
    body = numbered + b"data: [DONE]\n\n"
    assert WHOLE_ANSWERS in _names(_history([_seen(1, body)], ["g1"]))
    # After an event that carried an id, even a bare comment block dispatches.
    with_id = b"id: 1-ab\n" + _chunk("g1", "Hello") + b": ping\n\n" + _chunk("g1", " there.")
    body = with_id + b"data: [DONE]\n\n"
    assert WHOLE_ANSWERS in _names(_history([_seen(1, body)], ["g1"]))
    # Comments relayed bare, as lines of no block, are what the SDK ignores.
    bare = b": ping\n" + _chunk("g1", "Hello") + b": ping\n" + _chunk("g1", " there.")
    assert WHOLE_ANSWERS not in _names(_history([_seen(1, bare + b"data: [DONE]\n\n")], ["g1"]))


def test_an_answer_that_names_the_store_is_a_violation() -> None:
    # Issue 29, defect 8: a stalled Redis's own message reached the caller.
    leaked = b'{"type":"store-timeout","detail":"Timeout reading from 127.0.0.1:6390"}'
    seen = _seen(1, leaked)
    seen.status = 503
    history = _history([seen], [], store_marks=("127.0.0.1:6390",))
    assert STORE_HIDDEN in _names(history)
    fixed = _seen(1, b'{"type":"store-timeout","detail":"the store did not answer in time"}')
    fixed.status = 503
    assert STORE_HIDDEN not in _names(_history([fixed], [], store_marks=("127.0.0.1:6390",)))


def test_a_full_disk_excuses_nothing_when_only_the_call_log_is_on_it() -> None:
    history = _history(
        [_seen(0, _stream("g1")), _seen(1, _stream("g1"))],
        ["g1", "g2"],
        played=[Played(Fault(0, 0.0, "disk", 3.5, target=0), 0.2, 3.7)],
        store="redis",
    )
    assert _names(history) == {BILLED_ONCE}


def _billed(generation: str, finished: float) -> dict[str, Any]:
    stamp = datetime.datetime.fromtimestamp(finished, datetime.UTC).isoformat()
    return {"provider_request_id": generation, "user": "k", "finished_at": stamp}


def test_a_retry_after_the_record_expired_may_bill_again_but_not_during_the_first_call() -> None:
    first, retry = _seen(0, _stream("g1")), _seen(1, _stream("g2"))
    first.sent_at, retry.sent_at = 1000.0, 1004.5
    # g1 finished at 1001: its record lived until 1004 (--ttl 3s); the retry came after.
    expired = _history([first, retry], [], ledger=[_billed("g1", 1001), _billed("g2", 1005)])
    expired.ttl = 3.0
    assert _names(expired) == set()
    # g1 ran until 1006 (a call longer than --ttl): the record was still its.
    running = _history([first, retry], [], ledger=[_billed("g1", 1006), _billed("g2", 1005)])
    running.ttl = 3.0
    assert _names(running) == {BILLED_ONCE, REPLAY_EQUALS_FIRST}


def test_a_different_body_after_the_record_expired_is_a_new_request() -> None:
    first = _seen(0, _stream("g1"))
    other = _seen(1, _stream("g2"), mismatch=True)
    first.sent_at, other.sent_at = 1000.0, 1005.0
    history = _history([first, other], [], ledger=[_billed("g1", 1001), _billed("g2", 1006)])
    history.ttl = 3.0
    assert KEY_REUSE not in _names(history)
    history.ttl = None  # records live a day: the key was taken
    assert KEY_REUSE in _names(history)


def test_a_call_held_by_two_stops_back_to_back_may_arrive_after_the_record_expired() -> None:
    # Found by a PostgreSQL run (seed 2128899638): the different body was sent during
    # one stop of its gateway and waited through the next, which began after it was
    # sent; it reached the gateway after the first answer's record had expired.
    first = _seen(0, _stream("g1"))
    other = _seen(1, _stream("g2"), mismatch=True)
    first.sent_at, other.sent_at = 1000.0, 1003.0
    stops = [
        Played(Fault(0, 0.5, "stop", 1.1, target=0), 0.5, 1.6),
        Played(Fault(1, 1.6, "stop", 2.0, target=0), 1.65, 3.7),
    ]
    ledger = [_billed("g1", 1001), _billed("g2", 1006.3)]
    history = _history([first, other], [], ledger=ledger, played=stops)
    history.ttl = 4.0
    assert KEY_REUSE not in _names(history)
    history.played = stops[:1]  # the first stop alone: it reached the gateway at 1004.1
    assert KEY_REUSE in _names(history)


def _embeddings(count: int, width: int = 8) -> bytes:
    vectors = [{"object": "embedding", "index": n, "embedding": "A" * width} for n in range(count)]
    return json.dumps({"object": "list", "data": vectors}).encode()


def test_a_large_whole_answer_is_checked_by_its_generation_and_its_vectors() -> None:
    def seen(number: int, body: bytes, upstream_id: str) -> Observation:
        observation = _seen(number, body, api="embeddings", inputs=3)
        observation.call = dataclasses.replace(observation.call, stream=False)
        observation.upstream_id = upstream_id
        return observation

    whole = [seen(0, _embeddings(3), "g1"), seen(1, _embeddings(3), "g1")]
    assert _names(_history(whole, ["g1"])) == set()
    cut = [seen(0, _embeddings(3), "g1"), seen(1, _embeddings(2), "g1")]
    assert _names(_history(cut, ["g1"])) == {WHOLE_ANSWERS}
    twice = [seen(0, _embeddings(3), "g1"), seen(1, _embeddings(3), "g2")]
    assert _names(_history(twice, ["g1", "g2"])) == {BILLED_ONCE, REPLAY_EQUALS_FIRST}


def test_a_status_that_counts_other_replays_than_the_call_logs_is_a_violation() -> None:
    observations = [_seen(0, _stream("g1")), _seen(1, _stream("g1"))]
    history = _history(observations, ["g1"])
    history.call_log[0].update(key="k", outcome="forwarded")
    history.call_log[1].update(key="k", outcome="replayed")
    history.replays = {0: {"k": 1}, 1: {"k": 1}}
    assert _names(history) == set()
    history.replays = {0: {"k": 1}, 1: {"k": 0}}  # gateway 0's counts never reached the store
    assert _names(history) == {STATUS}
    history.replays = {0: {"k": 2}, 1: {"k": 2}}  # a flush counted twice
    assert _names(history) == {STATUS}


def test_a_record_that_began_again_counts_its_own_replays_only() -> None:
    first, replay, later = _seen(0, _stream("g1")), _seen(1, _stream("g1")), _seen(2, _stream("g2"))
    first.sent_at, replay.sent_at, later.sent_at = 1000.0, 1001.5, 1004.5
    history = _history(
        [first, replay, later], [], ledger=[_billed("g1", 1001), _billed("g2", 1005)]
    )
    history.ttl = 3.0
    for line, outcome in zip(history.call_log, ["forwarded", "replayed", "forwarded"], strict=True):
        line.update(key="k", outcome=outcome)
    history.replays = {0: {"k": 0}}  # the new record has served no replay yet
    assert _names(history) == set()


def test_a_call_held_up_by_a_stopped_gateway_may_arrive_after_the_record_expired() -> None:
    # Sent 0.2 s before the record expired, to a gateway stopped for 1 s then.
    first, retry = _seen(0, _stream("g1")), _seen(1, _stream("g2"))
    first.sent_at, retry.sent_at = 1000.0, 1003.8
    retry.started = 3.8
    history = _history([first, retry], [], ledger=[_billed("g1", 1001), _billed("g2", 1005)])
    history.ttl = 3.0
    assert _names(history) == {BILLED_ONCE, REPLAY_EQUALS_FIRST}
    history.played = [Played(Fault(0, 3.5, "stop", 1.0, target=0), 3.5, 4.5)]
    assert _names(history) == set()


def test_faults_back_to_back_on_one_gateway_excuse_what_each_alone_would_not() -> None:
    # A 1.8 s full disk (SQLite: no renewal) and then a 1.7 s stop of the same
    # gateway: 3.5 s without a renewal, longer than the lease (found by a long run).
    disk = Played(Fault(0, 4.5, "disk", 1.8, target=0), 7.6, 9.4)
    stop = Played(Fault(1, 8.8, "stop", 1.7, target=0), 9.4, 11.1)
    observations = [_seen(0, _stream("g1")), _seen(1, _stream("g1"))]
    history = _history(observations, ["g1", "g2"], played=[disk, stop])
    assert _names(history) == set()
    assert "disk#0, stop#1" in history.excused[0]
    apart = Played(Fault(1, 8.8, "stop", 1.7, target=0), 10.6, 12.3)  # a renewal fits between
    assert _names(_history(observations, ["g1", "g2"], played=[disk, apart])) == {BILLED_ONCE}
