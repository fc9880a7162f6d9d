"""The recipes of docs/recipes.md, run end to end: a slow simulator, gateways, a framework.

Every generation takes 2.5 s (``--latency fixed:2.5s``) and every recipe's
client gives up after 1 s, so each call's first attempt times out and the
framework retries: what a business request costs is then read from the
simulator's ledger. The recipes are the code blocks of docs/recipes.md, run as
written but for the gateway's address and the timeout (:func:`recipe`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import frameworks, prepare
from tests.support.processes import Process, start_payonce
from tests.support.sim import Sim, running_sim

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "recipes.md"
# The address and the timeout the recipes are written with, and what the tests use.
DOC_URL = "http://127.0.0.1:8080"
DOC_TIMEOUTS = {"timeout=60": "timeout=1", "timeout: 60_000": "timeout: 1_000"}
MARKER = re.compile(r"<!-- run by (tests/recipes/\S+\.py): ([\w-]+) -->\n```(\w+)\n(.*?)```", re.S)


def recipes() -> dict[str, tuple[str, str]]:
    """Every marked code block of docs/recipes.md: name -> (test file, code)."""
    found: dict[str, tuple[str, str]] = {}
    for test, name, _language, code in MARKER.findall(DOC.read_text()):
        assert name not in found, f"two recipes named {name}"
        found[name] = (test, code)
    return found


def recipe(name: str, gateway_url: str) -> str:
    """The recipe ``name`` as it runs here: this gateway, a 1 s timeout."""
    code = recipes()[name][1]
    assert DOC_URL in code, f"{name}: the recipe does not name {DOC_URL}"
    code = code.replace(DOC_URL, gateway_url)
    for written, used in DOC_TIMEOUTS.items():
        code = code.replace(written, used)
    assert "timeout=1" in code or "timeout: 1_000" in code, f"{name}: no timeout to shorten"
    return code


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """A simulator whose every generation takes 2.5 s: longer than the recipes' 1 s timeout."""
    with running_sim(
        "--latency", "fixed:2.5s", "--seed", "7", log_dir=tmp_path_factory.mktemp("sim")
    ) as sim:
        yield sim


def _gateway(sim: Sim, tmp: Path, *flags: str) -> Iterator[Process]:
    process = start_payonce(
        ["serve", "--upstream", sim.url, "--store", "memory://", "--no-otel", *flags],
        log_dir=tmp,
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The gateway as it ships: SDK retries matched, no identical-request dedupe."""
    yield from _gateway(sim, tmp_path_factory.mktemp("gateway"))


@pytest.fixture(scope="module")
def dedupe_gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The gateway with ``--dedupe-identical 2m``."""
    yield from _gateway(sim, tmp_path_factory.mktemp("dedupe"), "--dedupe-identical", "2m")


def prepared(what: frameworks.VirtualEnv | frameworks.NodeSDK, tests: str) -> Path:
    """The prepared folder of ``what``; the test fails (never skips) when it cannot be made."""
    failed = prepare.failed(tests)
    if failed is not None:
        pytest.fail(f"could not prepare {what.name}: {failed}", pytrace=False)
    try:
        return frameworks.prepare(what).path
    except Exception as exc:
        message = f"could not prepare {what.name}: {exc}"
    pytest.fail(message, pytrace=False)


def bills(sim: Sim, *, deadline: float = 30.0) -> int:
    """What the simulator billed since its last reset, once nothing is generating
    (an attempt whose client gave up still finishes and bills); then reset."""
    end = time.monotonic() + deadline
    while (ledger := sim.ledger())["generating"] and time.monotonic() < end:
        time.sleep(0.1)
    sim.reset()
    return int(ledger["billed"])


def environment(**extra: str) -> dict[str, str]:
    """A framework's environment: API keys for the simulator, nothing that phones home."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "ANTHROPIC_", "LITELLM_", "PYTHONPATH"))
    }
    return env | {
        "OPENAI_API_KEY": "sk-recipes-tenant",
        "ANTHROPIC_API_KEY": "sk-ant-recipes-tenant",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no price list fetched at import
        "OPENAI_AGENTS_DISABLE_TRACING": "1",  # no traces sent to OpenAI
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def outcomes(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The driver's lines: one JSON object per business request it handled."""
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, (
        f"exit {done.returncode}, no outcome:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return [json.loads(line) for line in lines]
