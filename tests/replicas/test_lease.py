"""A dead holder's lease lapses: the status endpoint says so, and the client re-sends.

Issue 12, item 1, the way the review found it: two gateways on one store behind
a load balancer, ``payonce.client`` posting through it, the gateway running the
call killed. Before the fix gateway B answered ``in_progress`` long after the
lease lapsed, ``?wait=`` returned at once, and the client asked ~3,700 times a
second until its deadline, then raised without ever re-sending.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal

import httpx2 as httpx
import pytest

from payonce.client import ErrorClass, IdempotentTransport, Outcome, RetryPolicy, attempt_history
from tests.replicas.conftest import AUTH, CHAT, Gateways, post, wait_until
from tests.support.proxy import running_proxy
from tests.support.redis import RedisServer
from tests.support.sim import Sim

pytestmark = pytest.mark.slow

LEASE = "3s"
SLOW = {"X-Sim-Delay-Ms": "5000"}
STATUS_LINE = b"GET /_payonce/requests/"
# The fixed client asks once or twice (the first long-poll ends when the lease
# lapses). This bound only catches a client that polls without waiting.
MOST_STATUS_REQUESTS = 10


def test_a_killed_holder_is_taken_over_through_the_load_balancer_and_bills_twice(
    start_gateways: Gateways, redis: RedisServer, fresh_sim: Sim
) -> None:
    a, b = start_gateways(2, "--lease", LEASE, store=redis.url)
    policy = RetryPolicy(attempts=3, deadline=30, read_timeout=20)
    transport = IdempotentTransport(policy=policy, gateway=True, hooks=())
    key = "lease-lapsed-through-the-balancer"
    with (
        running_proxy([a.url, b.url], STATUS_LINE) as balancer,
        httpx.Client(transport=transport) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        call = pool.submit(
            client.post,
            balancer.url + "/v1/chat/completions",
            json=CHAT,
            headers={**AUTH, **SLOW, "Idempotency-Key": key},
            timeout=60,
        )
        wait_until(lambda: fresh_sim.requests() >= 1, "gateway A to forward the call")
        os.kill(a.popen.pid, signal.SIGKILL)
        response = call.result(timeout=60)
        status_requests = balancer.count()

    assert response.status_code == 200
    assert response.headers["idempotent-replayed"] == "false", "B ran it again"
    history = attempt_history(response)
    assert [attempt.outcome for attempt in history] == [Outcome.RETRIED, Outcome.SUCCESS]
    assert history[0].error_class is ErrorClass.AMBIGUOUS
    assert 1 <= status_requests <= MOST_STATUS_REQUESTS, f"{status_requests} status requests"

    # docs/gateway.md, failure mode 2: A's orphaned generation finishes and is billed,
    # nobody receives it; the retry's run is billed too and is the stored answer.
    wait_until(lambda: fresh_sim.billed() == 2, "the orphaned generation to be billed")
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (2, 2)
    assert sorted(entry["client_connected"] for entry in ledger["entries"]) == [False, True]
    replay = post(b.url, key)
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == response.content, "the retry's answer is the one kept"


def test_a_stream_follower_on_another_replica_is_cut_off_when_the_holder_dies(
    start_gateways: Gateways, redis: RedisServer, fresh_sim: Sim
) -> None:
    # B relays A's stream from Redis. When A dies its lease lapses and no event
    # will ever come: B must end the follower's stream broken (so its client
    # retries, and the retry runs again), not re-read the dead record in a busy
    # loop that never ends (before the fix: the client's read timed out).
    a, b = start_gateways(2, "--lease", "1s", store=redis.url)
    key = "stream-of-a-dead-holder"
    body = {**CHAT, "stream": True, "max_tokens": 200}
    slow = {"X-Sim-Token-Ms": "100"}
    headers = {**AUTH, **slow, "Idempotency-Key": key}
    url = "/v1/chat/completions"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, a.url, key, body=body, headers=slow)
        wait_until(lambda: fresh_sim.requests() >= 1, "gateway A to forward the stream")
        with httpx.stream("POST", b.url + url, json=body, headers=headers, timeout=20) as follower:
            assert follower.headers["idempotent-replayed"] == "true", "B follows A's run"
            chunks = follower.iter_bytes()
            assert next(chunks)
            os.kill(a.popen.pid, signal.SIGKILL)
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in chunks:
                    pass
        with pytest.raises(httpx.HTTPError):
            first.result()
    retry = post(b.url, key, body=body)
    assert (retry.status_code, retry.headers["idempotent-replayed"]) == (200, "false")
