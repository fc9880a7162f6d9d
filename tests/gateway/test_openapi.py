"""The OpenAPI description of the gateway's own endpoints, and schemathesis against a live gateway.

One ``payonce serve --upstream sim`` process serves the whole module (its own
simulator child on a free port, an SQLite store, a metrics token): schemathesis
reads the description from it and throws generated requests at every operation.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule, run_state_machine_as_test
from schemathesis import GenerationMode
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

import payonce.errors
from payonce.errors import ProblemError
from payonce.gateway import admin
from payonce.gateway.openapi import openapi_document, openapi_json, problem_slugs
from tests.support.processes import Process, free_port, start_payonce

ROOT = Path(__file__).resolve().parents[2]
METRICS_TOKEN = "scrape-token-for-tests"
AUTH = {"Authorization": "Bearer sk-openapi-tenant"}
FAST = {"X-Sim-Delay-Ms": "0"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


# --- the document, without a gateway -------------------------------------------------


def test_the_document_lists_exactly_the_routes_the_gateway_dispatches() -> None:
    assert set(openapi_document()["paths"]) == set(admin.ROUTES)


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi_document()
    assert document["openapi"].startswith("3.1.")
    OPENAPI_31_VALIDATOR.validate(document)
    loaded = schemathesis.openapi.from_dict(document)
    loaded.validate()
    operations = [result.ok() for result in loaded.get_all_operations()]
    assert {operation.path for operation in operations} == set(admin.ROUTES)


def _problem_classes() -> list[type[ProblemError]]:
    return [
        value
        for value in vars(payonce.errors).values()
        if isinstance(value, type) and issubclass(value, ProblemError)
    ]


def test_every_problem_type_is_documented_in_problems_md() -> None:
    headings = set(re.findall(r"^## (\S+)$", (ROOT / "docs/problems.md").read_text(), re.M))
    slugs = {error.slug for error in _problem_classes()}
    assert slugs - headings == set(), "problem types without a section in docs/problems.md"
    assert problem_slugs() <= headings


def test_every_problem_the_admin_endpoints_send_is_in_the_document() -> None:
    text = openapi_json().decode()
    for slug in problem_slugs():
        assert f"problems.md#{slug}" in text, slug


# --- a live gateway -------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """``payonce serve --upstream sim``: the gateway and its own simulator child."""
    tmp = tmp_path_factory.mktemp("openapi")
    process = start_payonce(
        [
            "serve",
            "--upstream",
            "sim",
            "--sim-port",
            str(free_port()),
            "--store",
            f"sqlite:///{tmp}/payonce.db",
            "--metrics-token",
            METRICS_TOKEN,
            "--wait-timeout",
            "2",
        ],
        log_dir=tmp,
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()
        log = process.output()
        assert "Traceback" not in log, log[-3000:]


def _proxy(live: Process, key: str | None, body: Any = CHAT, **headers: str) -> httpx.Response:
    sent = {**AUTH, **FAST, **headers}
    if key is not None:
        sent["Idempotency-Key"] = key
    return httpx.post(live.url + "/v1/chat/completions", json=body, headers=sent, timeout=30)


def test_the_gateway_serves_its_description(live: Process) -> None:
    with urllib.request.urlopen(live.url + "/_payonce/openapi.json", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
        assert json.loads(response.read()) == openapi_document()


def test_every_documented_route_answers_on_the_live_gateway(live: Process) -> None:
    assert _proxy(live, "route-check").status_code == 200
    headers = {**AUTH, "Authorization": f"Bearer {METRICS_TOKEN}"}
    for template in openapi_document()["paths"]:
        path = template.replace("{key}", "route-check")
        sent = headers if template.endswith("metrics") else AUTH
        response = httpx.get(live.url + path, headers=sent, timeout=10)
        assert response.status_code == 200, (path, response.text)
    missing = httpx.get(live.url + "/_payonce/no-such-endpoint", timeout=10)
    assert missing.status_code == 404
    assert missing.json()["type"].endswith("#not-found")


def test_a_405_names_the_methods_it_allows(live: Process) -> None:
    request = urllib.request.Request(live.url + "/_payonce/health", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    with caught.value as error:
        assert error.code == 405
        assert error.headers["Allow"] == "GET, HEAD"
        assert error.headers["Content-Type"] == "application/problem+json"


def test_a_401_names_the_scheme_it_wants(live: Process) -> None:
    response = httpx.get(live.url + "/_payonce/metrics", timeout=10)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer ")
    assert response.json()["type"].endswith("#unauthorized")


def problem_json_for_every_4xx(ctx: Any, response: Any, case: Any) -> None:
    """The gateway's own 4xx are problem documents; a stored upstream answer says it is one."""
    if 400 <= response.status_code < 500 and response.headers.get("idempotent-replayed") != [
        "true"
    ]:
        content_type = response.headers.get("content-type", [""])[0]
        assert content_type == "application/problem+json", (response.status_code, content_type)
        document = json.loads(response.content)
        assert document["status"] == response.status_code
        assert document["type"].startswith(payonce.errors.PROBLEM_BASE)


@pytest.fixture(scope="module")
def live_schema(live: Process) -> Any:
    return schemathesis.openapi.from_url(live.url + "/_payonce/openapi.json")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_no_5xx_and_no_response_outside_the_schema(
    live_schema: Any, mode: GenerationMode
) -> None:
    # Operation by operation, with hypothesis directly: schemathesis's own pytest
    # parametrisation (from_fixture) reads a node attribute pytest 9 no longer has.
    for result in live_schema.get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and "{key}" not in operation.path:
            continue  # no parameter to get wrong

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=15,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def call(case: Any) -> None:
            case.call_and_validate(additional_checks=[problem_json_for_every_4xx], timeout=15)

        call()


def test_the_schemathesis_command_passes_against_the_live_gateway(
    live: Process, tmp_path: Path
) -> None:
    # What a user runs (docs/gateway.md): its coverage phase also sends undeclared
    # methods (a 405 must carry Allow) and boundary values of every parameter.
    command = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [str(command), "run", live.url + "/_payonce/openapi.json", "--max-examples", "5", "--phases", "coverage",
         "--seed", "18", "--checks", "all", "--exclude-checks", "positive_data_acceptance"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


# --- stateful: records made through the proxy path, then probed ------------------------

# Any key the gateway takes: sent as an RFC 8941 string, spaces and quotes included.
keys = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40
).filter(lambda key: key not in (".", ".."))


def sf_string(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Records(RuleBasedStateMachine):
    """Keys sent through the proxy (answered, stored upstream errors, released 5xx, streams,
    still running), and every probe of their status and response checked against the
    description."""

    url: str
    loaded: Any
    created = Bundle("created")

    def __init__(self) -> None:
        super().__init__()
        self.sent: dict[str, str] = {}
        Records.runs += 1
        # Every run its own tenant: keys from an earlier run are not this run's records.
        self.auth = {"Authorization": f"Bearer sk-openapi-run-{Records.runs}"}

    runs = 0

    def _post(self, key: str, body: Any, **headers: str) -> httpx.Response:
        sent = {**self.auth, **FAST, "Idempotency-Key": sf_string(key), **headers}
        return httpx.post(self.url + "/v1/chat/completions", json=body, headers=sent, timeout=30)

    def _get(self, key: str, response: bool, query: str = "") -> httpx.Response:
        template = "/_payonce/requests/{key}" + ("/response" if response else "")
        path = template.replace("{key}", urllib.parse.quote(key, safe=""))
        got = httpx.get(self.url + path + query, headers=self.auth, timeout=30)
        assert got.status_code < 500, got.text
        if got.headers.get("idempotent-replayed") == "true" and got.status_code >= 400:
            # The upstream's own error, stored with the key and replayed as it was:
            # the description's "default" response, not one of the gateway's problems.
            return got
        self.loaded[template]["GET"].validate_response(got)
        return got

    @rule(target=created, key=keys, stream=st.booleans())
    def complete(self, key: str, stream: bool) -> str:
        response = self._post(key, {**CHAT, "stream": stream})
        if self.sent.get(key) == "completed":  # replayed, or another body: 422
            assert response.status_code in (200, 422), response.text
        else:
            assert response.status_code == 200, response.text
        self.sent[key] = "completed"
        return key

    @rule(target=created, key=keys, status=st.sampled_from(["400", "404", "500", "503"]))
    def fail_upstream(self, key: str, status: str) -> str:
        response = self._post(key, CHAT, **{"X-Sim-Fail": status})
        if self.sent.get(key) == "completed":  # headers are not the request: replayed, or 422
            assert response.status_code in (200, 422, int(status)), response.text
            return key
        assert response.status_code == int(status), response.text
        # A 5xx releases the key (a retry runs again); a 4xx is stored and replayed.
        self.sent[key] = "completed" if status.startswith("4") else "released"
        return key

    @rule(key=keys)
    def running(self, key: str) -> None:
        if key in self.sent:
            return
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(self._post, key, CHAT, **{"X-Sim-Delay-Ms": "400"})
            deadline = time.monotonic() + 5
            while self._get(key, False).status_code == 404 and time.monotonic() < deadline:
                time.sleep(0.02)
            # On a loaded machine the call may finish between two probes: then the
            # next probe must say so, never contradict the previous one.
            before = self._get(key, False).json()["state"]
            answer = self._get(key, True)
            after = self._get(key, False).json()["state"]
            assert before in ("in_progress", "completed") and after in ("in_progress", "completed")
            if answer.status_code == 409:
                assert before == "in_progress"
            else:
                assert answer.status_code == 200 and after == "completed", answer.text
            assert pending.result().status_code == 200
        assert self._get(key, False, "?wait=5").json()["state"] == "completed"
        self.sent[key] = "completed"

    @rule(key=st.one_of(created, keys), response=st.booleans())
    def probe(self, key: str, response: bool) -> None:
        got = self._get(key, response)
        state = self.sent.get(key)
        if state == "completed":
            assert got.status_code != 404, (key, got.text)
            if not response:
                assert got.json()["state"] == "completed"
        elif state in (None, "released"):
            assert got.status_code == 404, (key, got.text)


def test_records_made_through_the_proxy_match_the_description(
    live: Process, live_schema: Any
) -> None:
    Records.url, Records.loaded = live.url, live_schema
    run_state_machine_as_test(
        Records,
        settings=settings(
            max_examples=5,
            stateful_step_count=8,
            # No shrinking: against a live gateway the first failing run says enough.
            phases=[Phase.explicit, Phase.generate],
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        ),
    )
