"""Limits per tenant (issue 18), from the outside: urllib, a raw socket, the openai SDK.

One gateway per store and module, started with every limit; each test is a
tenant of its own (its own credential), so the tests do not share a budget:

* ``--max-inflight-per-tenant 2``: a third keyed call in flight is refused 429,
  other tenants and unkeyed calls are served, and a run whose client left keeps
  its slot until it ends;
* ``--max-new-keys-per-tenant 5/h``: the sixth new key is refused 429, replays
  and other tenants go on, nothing is stored for the refused key;
* ``--max-stored-body 2000``: larger answers (whole, or a stream's events) are
  relayed in full, not stored, and their key released; smaller ones are replayed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from payonce.clock import SystemClock
from payonce.config import GatewaySettings
from payonce.gateway.lease import Lease
from payonce.gateway.limits import NewKeys, limits_of
from payonce.gateway.live import LiveStream
from payonce.gateway.recording import record_stream
from payonce.observe.facts import UpstreamFacts
from payonce.store import MemoryStore
from tests.support.exposition import metric
from tests.support.processes import Process, start_payonce
from tests.support.redis import running_redis
from tests.support.sim import Sim, running_sim

BOUND = 2000  # --max-stored-body
SMALL = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
# The simulator answers as long as the prompt: about 600 tokens of 4 characters.
LARGE = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "word " * 480}],
    "max_tokens": 600,
}
SLOW = {"X-Sim-Delay-Ms": "2500"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """A simulator whose streams are fast (the shared one paces 50 tokens a second)."""
    with running_sim(
        "--latency",
        "fixed:0",
        "--seed",
        "7",
        "--token-rate",
        "2000/s",
        log_dir=tmp_path_factory.mktemp("sim"),
    ) as sim:
        yield sim


@dataclass
class Limited:
    """A gateway with every limit, and its call log."""

    process: Process
    call_log: Path

    @property
    def url(self) -> str:
        return self.process.url

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(self.url + "/_payonce/metrics", timeout=10) as answer:
            return metric(answer.read().decode(), name, **labels)

    def lines(self, key: str, count: int = 1) -> list[dict[str, Any]]:
        """The call log lines of ``key``, once ``count`` are there (written once a second)."""
        deadline = time.monotonic() + 10
        while True:
            found = [
                line
                for line in map(json.loads, self.call_log.read_text().splitlines())
                if line["key"] == key
            ]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def _start(sim: Sim, directory: Path, store: str) -> Limited:
    call_log = directory / "calls.jsonl"
    flags = ["--max-inflight-per-tenant", "2", "--max-new-keys-per-tenant", "5/h"]
    flags += ["--max-stored-body", str(BOUND), "--call-log", str(call_log)]
    process = start_payonce(
        ["serve", "--upstream", sim.url, "--store", store, *flags],
        log_dir=directory,
        ready_path="/_payonce/health",
    )
    return Limited(process, call_log)


@pytest.fixture(scope="module")
def sqlite_gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Limited]:
    directory = tmp_path_factory.mktemp("limits-sqlite")
    gateway = _start(sim, directory, f"sqlite:///{directory}/payonce.db")
    yield gateway
    gateway.process.stop()


@pytest.fixture(scope="module")
def redis_gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Limited]:
    directory = tmp_path_factory.mktemp("limits-redis")
    with running_redis(tmp_path_factory.mktemp("redis")) as redis:
        gateway = _start(sim, directory, redis.url)
        yield gateway
        gateway.process.stop()


@pytest.fixture(params=["sqlite", "redis"])
def gateway(request: pytest.FixtureRequest) -> Limited:
    """Each test that uses it runs once per store (the limits that touch the store)."""
    found: Limited = request.getfixturevalue(f"{request.param}_gateway")
    return found


Answer = tuple[int, dict[str, str], bytes]


def post(
    url: str,
    credential: str | None,
    key: str | None = None,
    body: dict[str, Any] | None = None,
    extra: dict[str, str] | None = None,
) -> Answer:
    headers = {"Content-Type": "application/json", **(extra or {})}
    if credential is not None:
        headers["Authorization"] = f"Bearer {credential}"
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body or SMALL).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, _lower(answer.headers.items()), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, _lower(error.headers.items()), error.read()


def _lower(items: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in items}


def status_of(url: str, credential: str | None, key: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url + f"/_payonce/requests/{key}")
    if credential is not None:
        request.add_header("Authorization", f"Bearer {credential}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def in_progress(url: str, credential: str | None, key: str) -> Callable[[], bool]:
    def check() -> bool:
        status, document = status_of(url, credential, key)
        return status == 200 and document["state"] == "in_progress"

    return check


def assert_limited(answer: Answer, slug: str) -> dict[str, Any]:
    status, headers, body = answer
    assert status == 429, body
    assert headers["content-type"] == "application/problem+json"
    assert int(headers["retry-after"]) >= 1
    assert headers["x-should-retry"] == "true"
    problem: dict[str, Any] = json.loads(body)
    assert problem["type"].endswith(f"problems.md#{slug}")
    assert problem["status"] == 429
    return problem


# -- --max-inflight-per-tenant --------------------------------------------------------------


def test_a_third_call_in_flight_is_refused_and_other_tenants_are_served(
    sqlite_gateway: Limited,
) -> None:
    url = sqlite_gateway.url
    before = sqlite_gateway.metric("payonce_tenant_limit_rejections_total", limit="in_flight")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        held = {
            (credential, index): pool.submit(post, url, credential, f"flight-{index}", None, SLOW)
            for credential in ("flight-a", None)  # None: the anonymous tenant
            for index in range(2)
        }
        for credential, index in held:
            wait_until(in_progress(url, credential, f"flight-{index}"), "the slow calls")
        problem = assert_limited(post(url, "flight-a", "flight-2"), "too-many-in-flight")
        assert "--max-inflight-per-tenant" in problem["detail"]
        # The anonymous tenant is a tenant like any other.
        assert_limited(post(url, None, "flight-2"), "too-many-in-flight")
        # Another tenant, and unkeyed calls of the limited one, are served meanwhile.
        assert post(url, "flight-b", "flight-0")[0] == 200
        assert post(url, "flight-a")[0] == 200
        assert all(future.result()[0] == 200 for future in held.values())
    # Nothing was claimed for the refused key: its retry runs now.
    status, headers, _ = post(url, "flight-a", "flight-2")
    assert (status, headers["idempotent-replayed"]) == (200, "false")
    after = sqlite_gateway.metric("payonce_tenant_limit_rejections_total", limit="in_flight")
    assert after - before == 2
    # The call log says what each client received (A twice, the anonymous tenant once).
    lines = sqlite_gateway.lines("flight-2", count=3)
    assert sorted((line["outcome"], line["status"]) for line in lines) == [
        ("forwarded", 200),
        ("rejected", 429),
        ("rejected", 429),
    ]


def _leave_a_stream_early(url: str, credential: str, key: str) -> None:
    """Start a slow keyed stream over a raw socket, read its first event, and leave."""
    body = json.dumps({**SMALL, "max_tokens": 60, "stream": True, "messages": LARGE["messages"]})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {credential}\r\nIdempotency-Key: {key}\r\n"
        f"X-Sim-Token-Ms: 50\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + body.encode())
        received = b""
        while b"data:" not in received:
            chunk = sock.recv(4096)
            assert chunk, "the gateway closed the stream"
            received += chunk
    # Closed: the run goes on for the retry (about 3 s of tokens), holding its slot.


def test_a_run_whose_client_left_keeps_its_slot(sqlite_gateway: Limited) -> None:
    url, tenant = sqlite_gateway.url, "flight-c"
    _leave_a_stream_early(url, tenant, "left-0")
    # The gateway notices at its next write (an event every 50 ms) and ends the
    # request; the run goes on for about 3 s.
    time.sleep(0.5)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(post, url, tenant, "left-1", None, SLOW)
        wait_until(in_progress(url, tenant, "left-1"), "the slow call")
        assert status_of(url, tenant, "left-0")[1]["state"] == "in_progress"
        # Two in flight: the stream nobody reads any more, and the slow call.
        assert_limited(post(url, tenant, "left-2"), "too-many-in-flight")
        assert slow.result()[0] == 200
    # Once the run ends (its stream is over --max-stored-body: released), the slot is free.
    wait_until(lambda: not in_progress(url, tenant, "left-0")(), "the end of the stream")
    assert post(url, tenant, "left-2")[0] == 200


def test_with_workers_each_worker_admits_its_share(
    sim: Sim, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("limits-workers")
    flags = ["--store", f"sqlite:///{directory}/payonce.db", "--workers", "2"]
    process = start_payonce(
        ["serve", "--upstream", sim.url, *flags, "--max-inflight-per-tenant", "2"],
        log_dir=directory,
        ready_path="/_payonce/health",
    )
    try:
        # Four calls at once, each on its own connection: whichever worker takes
        # each, a worker admits one (2 / 2), so the host admits one or two.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(
                pool.map(lambda i: post(process.url, "workers-a", f"w-{i}", None, SLOW), range(4))
            )
    finally:
        process.stop()
    admitted = [answer for answer in answers if answer[0] == 200]
    refused = [answer for answer in answers if answer[0] != 200]
    assert 1 <= len(admitted) <= 2
    for answer in refused:
        problem = assert_limited(answer, "too-many-in-flight")
        assert "this worker's share of 2" in problem["detail"]


# -- --max-new-keys-per-tenant ----------------------------------------------------------------


def test_a_flood_of_new_keys_is_refused_and_other_tenants_are_served(gateway: Limited) -> None:
    url = gateway.url
    for index in range(5):
        assert post(url, "keys-a", f"new-{index}")[0] == 200
    problem = assert_limited(post(url, "keys-a", "new-5"), "too-many-new-keys")
    assert "--max-new-keys-per-tenant" in problem["detail"]
    # 5 an hour: the next key in about 12 minutes.
    assert 600 <= int(post(url, "keys-a", "new-6")[1]["retry-after"]) <= 720
    # Nothing was stored for the refused keys; the stored ones are still replayed.
    assert status_of(url, "keys-a", "new-5")[0] == 404
    status, headers, _ = post(url, "keys-a", "new-0")
    assert (status, headers["idempotent-replayed"]) == (200, "true")
    # Tenant B floods nothing and is served.
    for index in range(3):
        assert post(url, "keys-b", f"new-{index}")[0] == 200
    assert gateway.metric("payonce_tenant_limit_rejections_total", limit="new_keys") >= 2
    assert [(line["outcome"], line["status"]) for line in gateway.lines("new-5")] == [
        ("rejected", 429)
    ]


# -- --max-stored-body -----------------------------------------------------------------------


def test_a_large_answer_is_relayed_whole_but_not_stored(gateway: Limited) -> None:
    url, tenant = gateway.url, "stored-a"
    before = gateway.metric("payonce_unstored_responses_total", reason="too_large")
    first = post(url, tenant, "large", LARGE)
    assert first[0] == 200
    assert len(first[2]) > BOUND
    assert int(first[1]["content-length"]) == len(first[2])
    assert json.loads(first[2])["usage"]["completion_tokens"] > 400
    # Its key was released: nothing to look up, and the retry runs (and bills) again.
    assert status_of(url, tenant, "large")[0] == 404
    second = post(url, tenant, "large", LARGE)
    assert (second[0], second[1]["idempotent-replayed"]) == (200, "false")
    assert json.loads(second[2])["id"] != json.loads(first[2])["id"]
    lines = gateway.lines("large", count=2)
    assert [(line["outcome"], line["not_stored"]) for line in lines] == [
        ("forwarded", "too_large")
    ] * 2
    assert lines[0]["output_tokens"] > 400  # usage and cost are still known
    after = gateway.metric("payonce_unstored_responses_total", reason="too_large")
    assert after - before == 2
    # A small answer is stored and replayed as ever.
    assert post(url, tenant, "small")[0] == 200
    assert post(url, tenant, "small")[1]["idempotent-replayed"] == "true"
    assert gateway.lines("small", count=2)[0]["not_stored"] is None


def _stream(url: str, tenant: str, key: str, tokens: int) -> tuple[str, str]:
    """Stream a chat completion with the openai SDK: (its text, Idempotent-Replayed)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=tenant, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=LARGE["messages"],  # type: ignore[arg-type]
        max_tokens=tokens,
        stream=True,
        extra_headers={"Idempotency-Key": key},
    )
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in raw.parse()
        if chunk.choices and chunk.choices[0].delta
    )
    return text, raw.headers["idempotent-replayed"]


def test_a_large_stream_is_relayed_whole_but_not_stored(gateway: Limited) -> None:
    url, tenant = gateway.url, "stored-b"
    text, replayed = _stream(url, tenant, "long-stream", 100)
    # 100 tokens of 4 characters: every event reached the client, over 2000 bytes of them.
    assert (len(text), replayed) == (400, "false")
    # Released as the stream ends (the SDK stops reading at [DONE], a moment before).
    wait_until(lambda: status_of(url, tenant, "long-stream")[0] == 404, "the release")
    again, replayed = _stream(url, tenant, "long-stream", 100)
    assert (again, replayed) == (text, "false")  # ran again: not a replay
    lines = gateway.lines("long-stream", count=2)
    assert [(line["stream"], line["not_stored"]) for line in lines] == [(True, "too_large")] * 2
    # A short stream is stored and replayed.
    short, replayed = _stream(url, tenant, "short-stream", 3)
    assert (len(short), replayed) == (12, "false")
    assert _stream(url, tenant, "short-stream", 3) == (short, "true")


# -- the limits' arithmetic ------------------------------------------------------------------


def test_each_worker_enforces_its_share() -> None:
    settings = GatewaySettings(
        store="sqlite:///x.db",
        workers=3,
        max_inflight_per_tenant=10,
        max_new_keys_per_tenant="30/m",
    )
    in_flight, new_keys = limits_of(settings)
    assert in_flight is not None and new_keys is not None
    assert in_flight.limit == 4  # ceil(10 / 3): the host admits at most 12
    assert (new_keys.capacity, new_keys.rate) == (10.0, 10 / 60)
    assert limits_of(GatewaySettings()) == (None, None)


def test_the_new_key_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = NewKeys(2, 60.0, now=lambda: now[0])
    assert bucket.check("t") is None
    for _ in range(3):  # claims that passed the check at once may overdraw it
        bucket.spend("t")
    refusal = bucket.check("t")
    assert refusal is not None and refusal.retry_after == pytest.approx(60.0)  # two to repay
    now[0] = 59.0
    assert bucket.check("t") is not None
    now[0] = 60.0
    assert bucket.check("t") is None
    assert bucket.check("other") is None


class _Upstream:
    """What record_stream reads of an upstream stream: status, headers, body chunks."""

    status = 200
    headers = (("content-type", "text/event-stream"),)

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def chunks(self, take: object = None) -> AsyncIterator[bytes]:
        yield self.body


class _SlowToBegin(MemoryStore):
    """A store whose begin_stream answers late, as Redis on a loaded machine may."""

    async def begin_stream(self, *args: Any) -> bool:
        await asyncio.sleep(0.05)
        return await super().begin_stream(*args)


async def test_the_bound_holds_however_late_recording_begins() -> None:
    # Found by the Redis run of the stream test: recording begins in the
    # background, and its success used to undo the stop at the bound.
    store = _SlowToBegin()
    claim = await store.claim("tenant", "key", "print", lease=30, ttl=60)
    events = b"".join(b'data: {"n": %d, "pad": "%s"}\n\n' % (n, b"x" * 100) for n in range(40))
    live, facts = LiveStream(200, ()), UpstreamFacts()
    lease = Lease.of(store, claim.record, clock=SystemClock(), duration=30, ttl=600)
    stored = await record_stream(
        lease,
        _Upstream(events),  # type: ignore[arg-type]
        live,
        strip_usage=False,
        on_last_event=lambda: None,
        joined=lambda: 0,
        facts=facts,
        max_stored=BOUND,
    )
    assert (stored, facts.not_stored) == (None, "too_large")
    assert await store.get("tenant", "key") is None  # released, not completed
    assert live.total == 40  # every event was relayed


def test_the_buckets_of_many_tenants_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("payonce.gateway.limits.MAX_BUCKETS", 100)
    now = [0.0]
    bucket = NewKeys(1, 3600.0, now=lambda: now[0])
    for number in range(1000):  # a caller minting credentials: a tenant each
        bucket.spend(f"tenant-{number}")
        assert len(bucket._buckets) <= 100
    # The most recent ones are remembered (and refused); the forgotten start full.
    assert bucket.check("tenant-999") is not None
    assert bucket.check("tenant-0") is None
