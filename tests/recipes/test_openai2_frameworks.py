"""LlamaIndex and instructor (the openai SDK 2.x), through payonce with a 1 s timeout
against a 2.5 s generation (conftest.py).

LlamaIndex: its recipe bills 1 per business request, run twice; as it ships,
1 per call; straight at the simulator 12 (its ``max_retries`` of 3 used by the
SDK and again by its own retry decorator: 4 x 3 attempts). instructor: every
answer of the simulator fails validation, so each business request is 3
instructor attempts (the first and 2 re-asks), each a new generation: the recipe
(a key per attempt) bills each once and nothing more when the request is re-run;
one key for the whole request makes the gateway refuse the re-ask (422), never
replay the bad answer. The frameworks run from their own virtualenv
(tests/support/frameworks.py), in a subprocess per run.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.recipes.conftest import bills, environment, outcomes, prepared, recipe
from tests.support import frameworks
from tests.support.processes import Process
from tests.support.sim import Sim

pytestmark = pytest.mark.timeout(600)  # the first run may build the virtualenv (about 1 minute)

HERE = Path(__file__).resolve().parent

LLAMAINDEX_NO_CODE = """
from llama_index.llms.openai import OpenAI
llm = OpenAI(model="gpt-4o-mini", api_base="http://127.0.0.1:8080/v1", timeout=60)
def handle(ticket):
    return str(llm.complete(f"Summarise ticket {ticket}"))
"""

INSTRUCTOR_NO_CODE = """
import instructor, openai
from pydantic import BaseModel
class Summary(BaseModel):
    summary: str
client = instructor.from_openai(
    openai.OpenAI(base_url="http://127.0.0.1:8080/v1", timeout=60), mode=instructor.Mode.JSON
)
def handle(ticket):
    return client.chat.completions.create(
        model="gpt-4o-mini", response_model=Summary, max_retries=2,
        messages=[{"role": "user", "content": f"Summarise ticket {ticket}"}],
    ).summary
"""

# The mistake the recipe avoids: one key for the business request, re-asks included.
INSTRUCTOR_ONE_KEY = INSTRUCTOR_NO_CODE.replace(
    "max_retries=2,", 'max_retries=2, extra_headers={"Idempotency-Key": f"summarise-{ticket}"},'
)


@pytest.fixture(scope="module")
def python() -> Path:
    path = prepared(frameworks.OPENAI2, "tests/recipes/test_openai2_frameworks.py")
    return path / "bin" / "python"


def ticket() -> str:
    """A business request of its own: the gateway and its keys are shared by the module."""
    return uuid.uuid4().hex[:8]


def run(python: Path, code: str, url: str, tmp_path: Path, *tickets: str) -> list[dict[str, Any]]:
    script = tmp_path / "recipe.py"
    script.write_text(code.replace("http://127.0.0.1:8080", url).replace("timeout=60", "timeout=1"))
    done = subprocess.run(
        [str(python), str(HERE / "driver.py"), str(script), *tickets],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment(),
        cwd=tmp_path,
        check=False,
    )
    return outcomes(done)


def test_llamaindex_recipe_bills_once_per_business_request(
    python: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    first, again = run(
        python, recipe("llamaindex", gateway.url), gateway.url, tmp_path, *[ticket()] * 2
    )
    assert first.get("answer"), first
    assert again == first
    assert bills(sim) == 1


def test_llamaindex_with_no_code_bills_once_per_call(
    python: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    first, again = run(python, LLAMAINDEX_NO_CODE, gateway.url, tmp_path, *[ticket()] * 2)
    assert first.get("answer") and again.get("answer"), (first, again)
    assert bills(sim) == 2  # one per call: the re-run is a new business request without a key


def _failed_validation(outcome: dict[str, Any]) -> int:
    """How many attempts instructor made before giving up on validation."""
    assert outcome.get("error") == "InstructorRetryException", outcome
    assert "validation error for Summary" in outcome["message"], outcome
    return int(outcome["attempts"])


def test_instructor_recipe_bills_each_attempt_once_and_a_rerun_nothing(
    python: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    first, again = run(
        python, recipe("instructor", gateway.url), gateway.url, tmp_path, *[ticket()] * 2
    )
    attempts = _failed_validation(first)
    assert attempts == 3  # the first answer and two re-asks, each a new generation
    assert _failed_validation(again) == attempts
    assert bills(sim) == attempts, "each re-ask billed once, the re-run replayed"


def test_instructor_with_no_code_bills_each_attempt_once(
    python: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    (outcome,) = run(python, INSTRUCTOR_NO_CODE, gateway.url, tmp_path, ticket())
    assert bills(sim) == _failed_validation(outcome) == 3  # SDK retries matched, re-asks billed


def test_instructor_one_key_per_business_request_refuses_the_re_ask(
    python: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    (outcome,) = run(python, INSTRUCTOR_ONE_KEY, gateway.url, tmp_path, ticket())
    # The re-ask (another body) under the first attempt's key: refused, not replayed.
    assert "was first used with a different request" in outcome.get("message", ""), outcome
    assert bills(sim) == 1
