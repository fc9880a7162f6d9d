"""``payonce run``, ``import payonce.auto`` and ``protect()`` on every SDK release promised.

The applications are scripts run by the SDK release's own interpreter: openai
1.x and 2.x (on httpx) and anthropic 1.x from their pinned virtualenvs
(tests/support/sdks.py), openai 3.x and anthropic 2.x from payonce's. The
gateway runs with ``--no-match-sdk-retries``, so only a key sent by the SDK can
make its retries bill once; the simulator answers after 2.5 s and the clients
time out after 1 s, so every call is retried. The bill is the simulator's ledger.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from payonce.gateway.keys import tenant_of_credential
from tests.support import sdks
from tests.support.processes import Process, start_payonce
from tests.support.sim import Sim
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
OWN = Path(sys.executable)
# (interpreter, SDK package), each release payonce.auto promises.
RELEASES = {
    "openai-1": (lambda: sdks.SDKS[0].python, "openai"),
    "openai-2": (lambda: sdks.SDKS[1].python, "openai"),
    "openai-3": (lambda: OWN, "openai"),
    "anthropic-1": (lambda: sdks.SDKS[2].python, "anthropic"),
    "anthropic-2": (lambda: OWN, "anthropic"),
}

# One business request, in each SDK's words, on a client copied twice the way
# frameworks copy them (with_options() and copy() reset a key header set by hand).
APPS = {
    "openai": """
        import os
        import openai
        client = openai.OpenAI(
            api_key=os.environ["APP_CREDENTIAL"], timeout=1.0, max_retries=2,
            default_headers={"X-Sim-Delay-Ms": "2500"},
        )
        copied = client.with_options(max_retries=3).copy()
        print(copied.base_url)
        answer = copied.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Say hello"}]
        )
        print(answer.choices[0].message.content)
    """,
    "anthropic": """
        import os
        import anthropic
        client = anthropic.Anthropic(
            api_key=os.environ["APP_CREDENTIAL"], timeout=1.0, max_retries=2,
            default_headers={"X-Sim-Delay-Ms": "2500"},
        )
        copied = client.with_options(max_retries=3).copy()
        print(copied.base_url)
        message = copied.messages.create(
            model="claude-sonnet-4-0", max_tokens=32,
            messages=[{"role": "user", "content": "Say hello"}],
        )
        print(message.content[0].text)
    """,
}


@pytest.fixture(scope="module")
def unmatched(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A gateway that matches no SDK retry by itself: only keys protect."""
    folder = tmp_path_factory.mktemp("gateway")
    process = start_payonce(
        [
            *("serve", "--upstream", sim.url, "--store", "memory://", "--no-otel"),
            *("--no-match-sdk-retries", "--call-log", str(folder / "calls.jsonl")),
        ],
        log_dir=folder,
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()


def _calls(gateway: Process) -> list[dict[str, Any]]:
    path = gateway.log.parent / "calls.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _script(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(source))
    return path


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "ANTHROPIC_", "PAYONCE_", "PYTHON"))
    }
    return env | extra


def _payonce_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payonce", "run", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=env if env is not None else _clean_env(),
        check=False,
    )


@pytest.mark.parametrize("release", RELEASES)
def test_payonce_run_makes_every_copy_of_every_client_bill_once(
    unmatched: Process, fresh_sim: Sim, tmp_path: Path, release: str
) -> None:
    interpreter, package = RELEASES[release]
    app = _script(tmp_path, APPS[package])
    credential = f"sk-sdk-versions-{release}"
    done = _payonce_run(
        "--gateway",
        unmatched.url,
        "--",
        str(interpreter()),
        str(app),
        env=_clean_env(APP_CREDENTIAL=credential),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    base_url, answer = done.stdout.splitlines()[:2]
    assert base_url.rstrip("/") == unmatched.url + ("/v1" if package == "openai" else "")
    assert answer
    wait_until(lambda: fresh_sim.billed() >= 1, "the one generation billed")
    tenant = tenant_of_credential(credential)

    def lines() -> list[dict[str, Any]]:
        return [line for line in _calls(unmatched) if line["tenant"] == tenant]

    # The call log is written after each answer: the answered attempt's line may lag.
    wait_until(
        lambda: len(lines()) >= 2 and any(line["status"] == 200 for line in lines()),
        "the SDK's attempts in the call log, the answered one among them",
    )
    keys = {line["key"] for line in lines()}
    assert len(keys) == 1, f"one key on every attempt: {keys}"
    assert next(iter(keys)).startswith("stainless-python-retry-")
    assert fresh_sim.billed() == 1


def test_without_payonce_run_the_same_app_bills_each_attempt(
    unmatched: Process, fresh_sim: Sim, tmp_path: Path
) -> None:
    app = _script(tmp_path, APPS["openai"])
    env = _clean_env(OPENAI_BASE_URL=unmatched.url + "/v1", APP_CREDENTIAL="sk-sdk-no-run")
    done = subprocess.run(
        [str(sdks.SDKS[0].python), str(app)],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        check=False,
    )
    assert done.returncode != 0
    assert "APITimeoutError" in done.stderr
    wait_until(lambda: fresh_sim.billed() == 4, "four attempts, four bills", timeout=20)


def test_import_payonce_auto_after_the_sdk_patches_clients_made_later(
    unmatched: Process, fresh_sim: Sim, tmp_path: Path
) -> None:
    app = _script(
        tmp_path,
        f"""
        import openai
        import payonce.auto
        from payonce.auto import patched
        import openai._base_client
        assert patched(openai._base_client) == "X-Request-Key", patched(openai._base_client)
        client = openai.OpenAI(base_url="{unmatched.url}/v1", api_key="sk-auto-import")
        assert client.copy()._idempotency_header == "X-Request-Key"
        own = openai.OpenAI(base_url="{unmatched.url}/v1", api_key="sk-auto-import")
        own._idempotency_header = "Idempotency-Key"
        assert own._idempotency_header == "Idempotency-Key"
        print("ok")
        """,
    )
    env = _clean_env(PYTHONPATH=str(SRC), PAYONCE_KEY_HEADER="X-Request-Key")
    done = subprocess.run(
        [sys.executable, str(app)], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_payonce_run_keeps_the_environments_own_sitecustomize_and_reaches_child_processes(
    unmatched: Process, tmp_path: Path
) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    child = "import openai._base_client as b; from _payonce_auto_patch import patched; print(patched(b))"
    app = _script(
        tmp_path,
        f"""
        import os, subprocess, sys
        print(os.environ.get("OWN_SITECUSTOMIZE"))
        print(subprocess.run([sys.executable, "-c", {child!r}],
                             capture_output=True, text=True, check=True).stdout.strip())
        """,
    )
    done = _payonce_run(
        "--gateway",
        unmatched.url,
        "--",
        str(sdks.SDKS[1].python),
        str(app),
        env=_clean_env(PYTHONPATH=str(own)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["ran", "Idempotency-Key"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ((), 2, "run: no command given"),
        (("--", "no-such-program-payonce"), 127, "run: command not found: no-such-program"),
        (("--gateway", "ftp://x", "--", "true"), 2, "--gateway: 'ftp://x' is not an http"),
        (("--key-header", "bad header", "--", "true"), 2, "--key-header: 'bad header'"),
    ],
)
def test_payonce_run_refuses_bad_input_in_one_line(
    args: tuple[str, ...], code: int, message: str
) -> None:
    done = _payonce_run(*args)
    assert done.returncode == code
    assert done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr


PROTECTED = """
    import asyncio, json, sys
    import openai
    from payonce.client import RetryPolicy, attempt_history, protect

    base, slow = sys.argv[1] + "/v1", {"X-Sim-Delay-Ms": "2500"}
    messages = [{"role": "user", "content": "Say hello"}]
    client = protect(
        openai.OpenAI(base_url=base, api_key="sk-protect-httpx", timeout=1.0, default_headers=slow),
        gateway=True,
    )
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages)
    outcomes = [attempt.outcome.value for attempt in attempt_history(raw.http_response)]
    words = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, stream=True
        )
        if chunk.choices
    ]

    async def main():
        aclient = protect(
            openai.AsyncOpenAI(base_url=base, api_key="sk-protect-httpx", timeout=1.0,
                               default_headers=slow),
            gateway=True,
        )
        answer = await aclient.chat.completions.create(model="gpt-4o-mini", messages=messages)
        return answer.choices[0].message.content

    async_answer = asyncio.run(main())
    hopeless = protect(
        openai.OpenAI(base_url=base, api_key="sk-protect-httpx", timeout=0.5,
                      default_headers={"X-Sim-Delay-Ms": "3000"}),
        policy=RetryPolicy(attempts=2, deadline=2.0), gateway=False,
    )
    try:
        hopeless.chat.completions.create(model="gpt-4o-mini", messages=messages)
        error = None
    except openai.APITimeoutError as exc:
        error = type(exc).__name__
    print(json.dumps({
        "http": type(client._client).__module__.split(".")[0],
        "answer": raw.parse().choices[0].message.content,
        "outcomes": outcomes,
        "stream": "".join(words),
        "async": async_answer,
        "error": error,
    }))
"""


@pytest.mark.parametrize("sdk", sdks.SDKS[:2], ids=lambda sdk: sdk.name)
def test_protect_works_on_the_sdks_built_on_httpx(
    gateway: Process, fresh_sim: Sim, tmp_path: Path, sdk: sdks.Sdk
) -> None:
    app = _script(tmp_path, PROTECTED)
    done = subprocess.run(
        [str(sdk.python), str(app), gateway.url],
        capture_output=True,
        text=True,
        timeout=90,
        env=_clean_env(PYTHONPATH=str(SRC)),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["http"] == "httpx"
    assert seen["answer"] and seen["stream"] and seen["async"]
    assert seen["outcomes"][0] == "recovered" or seen["outcomes"][-1] == "success", seen
    assert seen["error"] == "APITimeoutError", "the policy's timeout reached the SDK as its own"
    # Four business requests, one generation each (the fourth's, left by its
    # client, is billed when it ends).
    wait_until(lambda: fresh_sim.billed() >= 4, "every generation billed", timeout=20)
    assert fresh_sim.billed() == 4
