"""The openai Node SDK through payonce (issue 31, parts 5 and 7).

Its timed-out retries are matched by the gateway with no code
(``x-stainless-retry-count``, as the Python SDKs send): 1 bill per call, where
straight at the simulator the same call bills 3. The recipe of docs/recipes.md
(a key per business request) bills 1 per business request, run twice. A
gateway refusal reaches the SDK's error with its message: ``err.message`` is
the problem's detail, not "422 status code (no body)". The SDK is installed by
``npm ci`` from tests/support/recipes/package-lock.json (tests/support/frameworks.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.recipes.conftest import bills, environment, outcomes, prepared, recipe
from tests.support import frameworks
from tests.support.processes import Process
from tests.support.sim import Sim

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent

NO_CODE = """
import OpenAI from "openai";
const client = new OpenAI({ baseURL: "http://127.0.0.1:8080/v1", timeout: 60_000 });
export async function handle(ticket) {
  const answer = await client.chat.completions.create({
    model: "gpt-4o-mini", messages: [{ role: "user", content: `Summarise ticket ${ticket}` }],
  });
  return answer.choices[0].message.content;
}
"""


@pytest.fixture(scope="module")
def node_modules() -> Path:
    if shutil.which("node") is None:
        pytest.fail("node not found: the Node SDK's tests need node and npm", pytrace=False)
    return prepared(frameworks.NODE, "tests/recipes/test_node_sdk.py") / "node_modules"


def run(
    node_modules: Path, code: str, url: str, tmp_path: Path, *tickets: str
) -> list[dict[str, Any]]:
    """The module against ``url``, once per ticket (Node finds the SDK beside it)."""
    script = tmp_path / "recipe.mjs"
    script.write_text(
        code.replace("http://127.0.0.1:8080", url).replace("timeout: 60_000", "timeout: 1_000")
    )
    if not (tmp_path / "node_modules").exists():
        os.symlink(node_modules, tmp_path / "node_modules")
    done = subprocess.run(
        ["node", str(HERE / "driver.mjs"), str(script), *tickets],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(),
        cwd=tmp_path,
        check=False,
    )
    return outcomes(done)


def ticket() -> str:
    return uuid.uuid4().hex[:8]


def test_a_timed_out_node_sdk_call_bills_once_with_no_code(
    node_modules: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    (outcome,) = run(node_modules, NO_CODE, gateway.url, tmp_path, ticket())
    assert outcome.get("answer"), outcome
    assert bills(sim) == 1


def test_the_node_recipe_bills_once_per_business_request(
    node_modules: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    first, again = run(
        node_modules, recipe("node", gateway.url), gateway.url, tmp_path, *[ticket()] * 2
    )
    assert first.get("answer"), first
    assert again == first
    assert bills(sim) == 1


def test_without_payonce_the_node_sdk_bills_every_attempt(
    node_modules: Path, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    (outcome,) = run(node_modules, NO_CODE, sim.url, tmp_path, ticket())
    assert outcome.get("error") == "APIConnectionTimeoutError", outcome
    assert bills(sim) == 3


REUSED_KEY = """
import OpenAI from "openai";
const client = new OpenAI({ baseURL: "http://127.0.0.1:8080/v1", timeout: 30_000, maxRetries: 0 });
export async function handle(ticket) {
  // The same key for another request: the gateway refuses it (422 fingerprint-mismatch).
  const key = { headers: { "Idempotency-Key": `summarise-${ticket}` } };
  const ask = (content) => client.chat.completions.create(
    { model: "gpt-4o-mini", messages: [{ role: "user", content }] }, key);
  await ask(`Summarise ticket ${ticket}`);
  await ask(`Summarise ticket ${ticket}, in French`);
}
"""


def test_a_gateway_refusal_shows_its_message_in_the_node_sdks_error(
    node_modules: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    name = ticket()
    (outcome,) = run(node_modules, REUSED_KEY, gateway.url, tmp_path, name)
    assert outcome["error"] == "UnprocessableEntityError", outcome
    assert outcome["status"] == 422
    assert outcome["message"] == (
        f"422 Idempotency-Key 'summarise-{name}' was first used with a different request"
    ), "the problem's detail, not '422 status code (no body)'"
    assert outcome["code"] == outcome["type"] == "fingerprint-mismatch"
    assert bills(sim) == 1
