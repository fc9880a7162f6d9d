"""``payonce reconcile --fetch``: the admin reports pulled over real HTTP, page by page.

Against a real ``payonce sim`` (pagination, both providers, a refused key) and against
a tiny ``http.server`` stub in this file where a provider must misbehave on cue (429,
503, a redirect, a key echoed back). Waits go through an injected ``sleep`` that
advances a :class:`~payonce.clock.ManualClock`, so nothing here sleeps for real.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import http.server
import json
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from payonce.cli import main
from payonce.clock import ManualClock
from payonce.errors import ConfigError, PayonceError
from payonce.reconcile.fetch import FetchRetry, fetch_reports
from tests.reconcile import data
from tests.support.processes import free_port
from tests.support.sim import Sim

OPENAI_ADMIN_KEY = "sk-admin-test-fetch-0123456789abcdef"
ANTHROPIC_ADMIN_KEY = "sk-ant-admin01-test-fetch-fedcba9876543210"
OPENAI_KEYS = ("sk-test-fetch-alpha-01234", "sk-test-fetch-bravo-56789")
ANTHROPIC_KEYS = ("sk-ant-test-fetch-charlie", "sk-ant-test-fetch-delta00")
SECRETS = (OPENAI_ADMIN_KEY, ANTHROPIC_ADMIN_KEY, *OPENAI_KEYS, *ANTHROPIC_KEYS)
DAY = 86400


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def never_sleep(seconds: float) -> None:
    raise AssertionError(f"slept {seconds} s: nothing here should be retried")


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def pages(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines(path)]


def buckets(path: Path) -> list[dict[str, Any]]:
    return [bucket for page in pages(path) for bucket in page["data"]]


def results(path: Path) -> list[dict[str, Any]]:
    return [result for bucket in buckets(path) for result in bucket["results"]]


def assert_no_secret(*texts: str | bytes) -> None:
    for text in texts:
        raw = text if isinstance(text, bytes) else text.encode()
        for secret in SECRETS:
            assert secret.encode() not in raw


def assert_files_have_no_secret(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            assert_no_secret(path.read_bytes())


def chat(sim: Sim, key: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "count my tokens please"}]}
    response = sim.post("/v1/chat/completions", body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200


def message(sim: Sim, key: str, model: str) -> None:
    body = {"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "hi you"}]}
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    assert sim.post("/v1/messages", body, headers=headers).status_code == 200


# ------------------------------------------------------------------ a provider on cue


@dataclass
class Seen:
    path: str
    headers: dict[str, str]  # names in lower case


@dataclass
class Stub:
    """A scripted HTTP server: each GET takes the next answer; the last one repeats."""

    url: str
    seen: list[Seen] = field(default_factory=list)


Answer = tuple[int, dict[str, str], bytes]


def page_body(data_: list[Any] | None = None, *, pretty: bool = True) -> bytes:
    document = {"object": "page", "data": data_ or [], "has_more": False, "next_page": None}
    return json.dumps(document, indent=2 if pretty else None).encode()


def openai_error(status: int, text: str) -> Answer:
    body = {"error": {"message": text, "type": "invalid_request_error", "param": None}}
    return status, {"Content-Type": "application/json"}, json.dumps(body, indent=2).encode()


@contextlib.contextmanager
def stub(*answers: Answer) -> Iterator[Stub]:
    script = list(answers)
    server_stub = Stub(url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            server_stub.seen.append(
                Seen(self.path, {k.lower(): v for k, v in self.headers.items()})
            )
            status, headers, body = script.pop(0) if len(script) > 1 else script[0]
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class Waits:
    """The injected clock and sleep: every wait is recorded and moves the clock."""

    clock: ManualClock = field(default_factory=ManualClock)
    slept: list[float] = field(default_factory=list)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)


def fetch_stub(
    server: Stub, tmp_path: Path, waits: Waits, provider: str = "openai", **kwargs: Any
) -> list[Path]:
    key = OPENAI_ADMIN_KEY if provider == "openai" else ANTHROPIC_ADMIN_KEY
    return fetch_reports(
        provider,
        dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 2, tzinfo=dt.UTC),
        base_url=server.url,
        admin_key=key,
        directory=tmp_path / "fetched",
        clock=waits.clock,
        sleep=waits.sleep,
        **kwargs,
    )


# ------------------------------------------------------------------ against payonce sim


def test_openai_usage_and_costs_follow_every_page(fresh_sim: Sim, tmp_path: Path) -> None:
    sim = fresh_sim
    chat(sim, OPENAI_KEYS[0], "gpt-4o")
    chat(sim, OPENAI_KEYS[0], "gpt-4o-mini")
    chat(sim, OPENAI_KEYS[1], "gpt-4o")
    ledger = sim.ledger()["entries"]
    until = now()
    since = until - dt.timedelta(days=200)  # 201 day buckets: 7 usage pages, 2 cost pages

    paths = fetch_reports(
        "openai",
        since,
        until,
        base_url=sim.url,
        admin_key=OPENAI_ADMIN_KEY,
        directory=tmp_path / "fetched",
        bucket_width="1d",
        sleep=never_sleep,
    )

    usage, costs = paths
    assert [p.name for p in paths] == ["openai-usage.jsonl", "openai-costs.jsonl"]
    first = math.floor(since.timestamp()) // DAY * DAY
    expected = len(range(first, math.ceil(until.timestamp()), DAY))
    # The largest page the width allows (31 daily buckets; costs: 180), to the end.
    assert [len(page["data"]) for page in pages(usage)[:-1]] == [31] * (
        math.ceil(expected / 31) - 1
    )
    assert len(buckets(usage)) == expected
    assert [len(page["data"]) for page in pages(costs)] == [180, expected - 180]
    for path in paths:
        found = pages(path)
        assert [page["has_more"] for page in found] == [True] * (len(found) - 1) + [False]
        starts = [bucket["start_time"] for bucket in buckets(path)]
        assert starts == list(range(first, first + expected * DAY, DAY))  # no gap, no repeat
    # Grouped by model, API key and project, and the counts are the ledger's.
    used = results(usage)
    assert sum(r["num_model_requests"] for r in used) == 3
    assert sum(r["input_tokens"] for r in used) == sum(e["input_tokens"] for e in ledger)
    assert {(r["model"], r["api_key_id"], r["project_id"]) for r in used} == {
        (e["model"], e["api_key_id"], e["project_id"]) for e in ledger
    }
    spent = results(costs)
    assert all(r["line_item"] and r["project_id"] for r in spent)
    assert sum(r["amount"]["value"] for r in spent) == pytest.approx(
        sum(e["cost_usd"] for e in ledger), abs=1e-9
    )
    assert_files_have_no_secret(tmp_path)


def test_anthropic_usage_and_cost_report_follow_every_page(fresh_sim: Sim, tmp_path: Path) -> None:
    sim = fresh_sim
    message(sim, ANTHROPIC_KEYS[0], "claude-3-5-haiku-latest")
    message(sim, ANTHROPIC_KEYS[1], "claude-sonnet-4-0")
    ledger = sim.ledger()["entries"]
    until = now()
    since = until - dt.timedelta(days=40)  # 961 hourly buckets: 6 pages; 41 days: 2 pages

    usage, costs = fetch_reports(
        "anthropic",
        since,
        until,
        base_url=sim.url,
        admin_key=ANTHROPIC_ADMIN_KEY,
        directory=tmp_path / "fetched",
        sleep=never_sleep,
    )

    assert (usage.name, costs.name) == ("anthropic-usage.jsonl", "anthropic-costs.jsonl")
    hours = len(
        range(math.floor(since.timestamp()) // 3600 * 3600, math.ceil(until.timestamp()), 3600)
    )
    assert [len(page["data"]) for page in pages(usage)] == [168] * (hours // 168) + [hours % 168]
    days = len(buckets(costs))
    assert days in (41, 42) and [len(page["data"]) for page in pages(costs)] == [31, days - 31]
    used = results(usage)
    assert sum(r["uncached_input_tokens"] for r in used) == sum(e["input_tokens"] for e in ledger)
    assert {(r["model"], r["api_key_id"], r["workspace_id"]) for r in used} == {
        (e["model"], e["api_key_id"], e["project_id"]) for e in ledger
    }
    spent = results(costs)
    assert all(r["description"] and r["workspace_id"] for r in spent)
    cents = sum(Decimal(r["amount"]) for r in spent)
    assert float(cents / 100) == pytest.approx(sum(e["cost_usd"] for e in ledger), abs=1e-9)
    assert_files_have_no_secret(tmp_path)


def test_each_page_is_saved_as_the_provider_sent_it(fresh_sim: Sim, tmp_path: Path) -> None:
    sim = fresh_sim
    chat(sim, OPENAI_KEYS[0], "gpt-4o")
    since = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    until = since + dt.timedelta(days=10)
    usage, _ = fetch_reports(
        "openai",
        since,
        until,
        base_url=sim.url + "/v1/",  # the SDKs' base URL form is accepted
        admin_key=OPENAI_ADMIN_KEY,
        directory=tmp_path,
        sleep=never_sleep,
    )
    # The same request by hand, as OpenAI documents it (group_by repeated).
    query = {
        "start_time": int(since.timestamp()),
        "end_time": int(until.timestamp()),
        "bucket_width": "1h",
        "limit": 168,
        "group_by": ["model", "api_key_id", "project_id"],
    }
    headers = {"Authorization": f"Bearer {OPENAI_ADMIN_KEY}"}
    first = httpx.get(sim.url + "/v1/organization/usage/completions", params=query, headers=headers)
    following = httpx.get(
        sim.url + "/v1/organization/usage/completions",
        params={**query, "page": first.json()["next_page"]},
        headers=headers,
    )
    assert lines(usage) == [first.content, following.content]


def test_a_refused_key_is_one_line_naming_the_variable(sim: Sim, tmp_path: Path) -> None:
    wrong = "sk-proj-not-an-admin-key-0123456789"
    for provider, variable, key in [
        ("openai", "OPENAI_ADMIN_KEY", wrong),
        ("anthropic", "ANTHROPIC_ADMIN_KEY", wrong),
    ]:
        with pytest.raises(ConfigError) as caught:
            fetch_reports(
                provider,
                now() - dt.timedelta(days=1),
                now(),
                base_url=sim.url,
                admin_key=key,
                directory=tmp_path / provider,
                sleep=never_sleep,
            )
        text = str(caught.value)
        assert text.startswith(f"{variable} was refused (401): ")
        assert "admin API key" in text  # the provider's own message
        assert "\n" not in text
        assert wrong not in text and wrong not in repr(caught.value)
        assert caught.value.__cause__ is None
        assert caught.value.__context__ is None or caught.value.__suppress_context__
        # Nothing half-written is left where the reports would go.
        assert not list((tmp_path / provider).glob("*.jsonl"))


# ------------------------------------------------------------------ against a stub


def test_openai_query_and_headers_are_as_documented(tmp_path: Path) -> None:
    with stub((200, {}, page_body())) as server:
        fetch_stub(server, tmp_path, Waits())
    usage, costs = server.seen
    assert usage.path == (
        "/v1/organization/usage/completions?bucket_width=1h&start_time=1793491200"
        "&end_time=1793577600&limit=168&group_by=model&group_by=api_key_id&group_by=project_id"
    )
    assert costs.path == (
        "/v1/organization/costs?bucket_width=1d&start_time=1793491200&end_time=1793577600"
        "&limit=180&group_by=line_item&group_by=project_id"
    )
    assert usage.headers["authorization"] == f"Bearer {OPENAI_ADMIN_KEY}"
    assert "x-api-key" not in usage.headers


def test_anthropic_query_and_headers_are_as_documented(tmp_path: Path) -> None:
    with stub((200, {}, page_body())) as server:
        fetch_stub(server, tmp_path, Waits(), "anthropic", bucket_width="1m")
    usage, costs = server.seen
    assert usage.path == (
        "/v1/organizations/usage_report/messages?bucket_width=1m"
        "&starting_at=2026-11-01T00:00:00Z&ending_at=2026-11-02T00:00:00Z&limit=1440"
        "&group_by[]=model&group_by[]=api_key_id&group_by[]=workspace_id"
    )
    assert costs.path == (
        "/v1/organizations/cost_report?bucket_width=1d&starting_at=2026-11-01T00:00:00Z"
        "&ending_at=2026-11-02T00:00:00Z&limit=31&group_by[]=description&group_by[]=workspace_id"
    )
    assert usage.headers["x-api-key"] == ANTHROPIC_ADMIN_KEY
    assert usage.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in usage.headers


def test_pretty_printed_pages_become_one_line_each_with_the_same_content(tmp_path: Path) -> None:
    bucket = {"object": "bucket", "start_time": 1, "end_time": 2, "results": [{"x": "a\\nb"}]}
    first = json.dumps(
        {"object": "page", "data": [bucket], "has_more": True, "next_page": "p2"}, indent=2
    )
    last = page_body([bucket])
    with stub((200, {}, first.encode()), (200, {}, last), (200, {}, last)) as server:
        usage, _ = fetch_stub(server, tmp_path, Waits())
    assert [json.loads(line) for line in lines(usage)] == [json.loads(first), json.loads(last)]
    assert server.seen[1].path.endswith("&page=p2")


def test_429_and_503_are_waited_out_honouring_retry_after(tmp_path: Path) -> None:
    waits = Waits()
    start = waits.clock.now()
    in_seven = email.utils.formatdate(start + 7, usegmt=True)
    with stub(
        (429, {"Retry-After": "2"}, b'{"error": {"message": "slow down"}}'),
        (429, {"Retry-After": in_seven}, b'{"error": {"message": "slow down"}}'),
        (503, {}, b"<html>upstream unavailable</html>"),
        (200, {}, page_body()),
    ) as server:
        usage, costs = fetch_stub(
            server, tmp_path, waits, retry=FetchRetry(backoff_initial=1.0, backoff_max=8.0)
        )
    # Three failed tries and a fourth that answered, then the cost report at once.
    assert len(server.seen) == 5
    assert waits.slept[:2] == [2.0, 5.0]  # seconds, then an HTTP date 7 s after the start
    assert len(waits.slept) == 3 and 0 <= waits.slept[2] <= 4.0  # full jitter, third retry
    assert pages(usage) == pages(costs) == [json.loads(page_body())]


def test_retries_stop_after_the_last_try(tmp_path: Path) -> None:
    waits = Waits()
    with (
        stub((503, {}, b'{"error": {"message": "overloaded"}}')) as server,
        pytest.raises(PayonceError) as caught,
    ):
        fetch_stub(server, tmp_path, waits, retry=FetchRetry(attempts=4))
    assert len(server.seen) == 4 and len(waits.slept) == 3
    text = str(caught.value)
    assert "\n" not in text and "503" in text and "overloaded" in text and "4 tries" in text
    assert not isinstance(caught.value, ConfigError)
    assert not list((tmp_path / "fetched").glob("*"))  # no partial file left behind


def test_retries_stop_at_the_deadline(tmp_path: Path) -> None:
    waits = Waits()
    with (
        stub((429, {"Retry-After": "40"}, b"{}")) as server,
        pytest.raises(PayonceError) as caught,
    ):
        fetch_stub(server, tmp_path, waits, retry=FetchRetry(attempts=10, deadline=100))
    # 40 s, 40 s, and a third wait would end past 100 s: given up after three tries.
    assert waits.slept == [40.0, 40.0] and len(server.seen) == 3
    assert "429" in str(caught.value) and "3 tries" in str(caught.value)


def test_connection_errors_are_retried(tmp_path: Path) -> None:
    waits = Waits()
    closed = Stub(url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(PayonceError) as caught:
        fetch_stub(closed, tmp_path, waits, retry=FetchRetry(attempts=3))
    assert len(waits.slept) == 2
    assert "cannot connect" in str(caught.value) and "\n" not in str(caught.value)


def test_other_4xx_is_one_line_with_the_providers_message_and_no_retry(tmp_path: Path) -> None:
    waits = Waits()
    with (
        stub(openai_error(400, "Invalid value for\n 'bucket_width'.")) as server,
        pytest.raises(PayonceError) as caught,
    ):
        fetch_stub(server, tmp_path, waits)
    assert not isinstance(caught.value, ConfigError)
    assert str(caught.value) == (
        "openai /v1/organization/usage/completions answered 400: Invalid value for 'bucket_width'."
    )
    assert len(server.seen) == 1 and waits.slept == []


def test_403_is_a_config_error(tmp_path: Path) -> None:
    with (
        stub(
            (
                403,
                {},
                b'{"type":"error","error":{"type":"permission_error","message":"not an admin"}}',
            )
        ) as server,
        pytest.raises(
            ConfigError, match=r"^ANTHROPIC_ADMIN_KEY was refused \(403\): not an admin$"
        ),
    ):
        fetch_stub(server, tmp_path, Waits(), "anthropic")


def test_a_key_echoed_by_the_provider_is_redacted(tmp_path: Path) -> None:
    echo = f"Incorrect API key provided: {OPENAI_ADMIN_KEY}."
    for answers in [
        [openai_error(401, echo)],
        [openai_error(400, echo)],
        [openai_error(500, echo)],
        [(429, {}, echo.encode())],
    ]:
        with stub(*answers) as server, pytest.raises(PayonceError) as caught:
            fetch_stub(server, tmp_path, Waits(), retry=FetchRetry(attempts=2))
        assert "Incorrect API key provided" in str(caught.value)
        assert_no_secret(str(caught.value), repr(caught.value), repr(caught.value.__cause__))
    assert_files_have_no_secret(tmp_path)


def test_redirects_are_not_followed_with_the_key(tmp_path: Path) -> None:
    with stub((200, {}, page_body())) as elsewhere:
        with (
            stub((302, {"Location": elsewhere.url + "/steal"}, b"")) as server,
            pytest.raises(PayonceError, match="302"),
        ):
            fetch_stub(server, tmp_path, Waits())
        assert elsewhere.seen == []


def test_has_more_without_a_new_cursor_is_an_error_not_a_loop(tmp_path: Path) -> None:
    body = json.dumps({"object": "page", "data": [], "has_more": True, "next_page": "same"})
    with (
        stub((200, {}, body.encode())) as server,
        pytest.raises(PayonceError, match="next_page"),
    ):
        fetch_stub(server, tmp_path, Waits())
    assert len(server.seen) == 2


def test_an_unwritable_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "fetched").write_text("a file, not a directory")
    with (
        stub((200, {}, page_body())) as server,
        pytest.raises(ConfigError, match=r"^cannot write the reports into "),
    ):
        fetch_stub(server, tmp_path, Waits())
    assert server.seen == []


def test_an_answer_that_is_not_a_page_is_an_error(tmp_path: Path) -> None:
    with (
        stub((200, {}, b"<html>login</html>")) as server,
        pytest.raises(PayonceError, match="not a report page"),
    ):
        fetch_stub(server, tmp_path, Waits())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"admin_key": "sk-admin-with\nnewline"}, "OPENAI_ADMIN_KEY: "),
        ({"admin_key": ""}, "OPENAI_ADMIN_KEY is empty"),
        ({"base_url": "http://api.example.com"}, "https://"),
        ({"base_url": "ftp://127.0.0.1"}, "--fetch-url"),
        ({"bucket_width": "5m"}, "--bucket-width"),
        ({"provider": "azure"}, "--fetch"),
        ({"until": dt.datetime(2026, 10, 1, tzinfo=dt.UTC)}, "--until"),
    ],
)
def test_bad_arguments_are_config_errors_without_the_key(
    kwargs: dict[str, Any], message: str, tmp_path: Path
) -> None:
    arguments: dict[str, Any] = {
        "provider": "openai",
        "since": dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
        "until": dt.datetime(2026, 11, 2, tzinfo=dt.UTC),
        "base_url": "http://127.0.0.1:9",
        "admin_key": OPENAI_ADMIN_KEY,
        "directory": tmp_path,
        "sleep": never_sleep,
        **kwargs,
    }
    provider, since, until = (
        arguments.pop("provider"),
        arguments.pop("since"),
        arguments.pop("until"),
    )
    with pytest.raises(ConfigError) as caught:
        fetch_reports(provider, since, until, **arguments)
    assert message in str(caught.value)
    assert "newline" not in str(caught.value) and "newline" not in repr(caught.value)
    assert_no_secret(str(caught.value), repr(caught.value))


# ------------------------------------------------------------------ the command


def run_cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payonce", "reconcile", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_ADMIN_KEY")}
    return env


def since_arg(days: int = 3) -> str:
    return (now() - dt.timedelta(days=days)).date().isoformat()


def test_cli_without_the_key_is_one_line_and_exit_2(
    sim: Sim, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    calls = data.payonce_calls(tmp_path)
    done = run_cli(
        "--calls", str(calls), "--fetch", "openai", "--since", since_arg(),
        "--fetch-url", sim.url, env=clean_env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("payonce: error: OPENAI_ADMIN_KEY is not set")


def test_cli_with_a_refused_key_is_one_line_and_exit_2(
    sim: Sim, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    calls = data.payonce_calls(tmp_path)
    wrong = "sk-proj-wrong-key-for-admin-0123456789"
    for provider, variable in [
        ("openai", "OPENAI_ADMIN_KEY"),
        ("anthropic", "ANTHROPIC_ADMIN_KEY"),
    ]:
        done = run_cli(
            "--calls", str(calls), "--fetch", provider, "--since", since_arg(),
            "--fetch-url", sim.url, "--save", str(tmp_path / "saved"),
            env={**clean_env, variable: wrong}, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1
        assert done.stderr.startswith(f"payonce: error: {variable} was refused (401): ")
        assert wrong not in done.stdout + done.stderr
    assert not list((tmp_path / "saved").glob("*.jsonl"))


def test_cli_fetch_saves_the_pages_and_never_shows_the_key(
    fresh_sim: Sim, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    sim = fresh_sim
    chat(sim, OPENAI_KEYS[0], "gpt-4o-mini")
    calls = data.payonce_calls(tmp_path)
    saved = tmp_path / "saved"
    done = run_cli(
        "--calls", str(calls), "--fetch", "openai", "--since", since_arg(10),
        "--fetch-url", sim.url, "--save", str(saved), "--json", str(tmp_path / "out.json"),
        env={**clean_env, "OPENAI_ADMIN_KEY": OPENAI_ADMIN_KEY}, cwd=tmp_path,
    )  # fmt: skip
    assert sorted(p.name for p in saved.iterdir()) == ["openai-costs.jsonl", "openai-usage.jsonl"]
    assert len(lines(saved / "openai-usage.jsonl")) == 2  # 10+ days of hours: two pages
    assert sum(r["num_model_requests"] for r in results(saved / "openai-usage.jsonl")) == 1
    assert "fetched" in done.stderr and str(saved) in done.stderr
    assert_no_secret(done.stdout, done.stderr)
    assert_files_have_no_secret(tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["schema"] == "payonce.reconcile.usage/1"
    assert document["billed_requests"] == 1
    assert {i["format"] for i in document["inputs"] if i["side"] == "bill"} == {
        "openai-usage",
        "openai-costs",
    }


def test_cli_fetch_flags_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = str(data.payonce_calls(tmp_path))
    monkeypatch.setenv("OPENAI_ADMIN_KEY", OPENAI_ADMIN_KEY)
    for args, message in [
        (["--fetch", "openai"], "--since is required with --fetch"),
        (["--since", "2026-11-01"], "--since needs --fetch"),
        (["--fetch", "openai", "--since", "yesterday"], "--since: expected an ISO date"),
        (["--fetch", "openai", "--since", "2026-11-02", "--until", "2026-11-01"], "--until"),
        (
            ["--fetch", "openai", "--since", "2026-11-01", "--fetch-url", "http://example.com"],
            "https://",
        ),
        ([], "--bill"),
    ]:
        try:
            main(["reconcile", "--calls", calls, *args])
            code = 0
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        out, err = capsys.readouterr()
        assert code == 2, (args, err)
        assert message in err and err.count("\n") == 1, (args, err)
        assert_no_secret(out, err)
