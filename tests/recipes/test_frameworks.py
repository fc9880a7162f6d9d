"""LangChain (OpenAI, Anthropic), the LiteLLM SDK, the OpenAI Agents SDK and pydantic-ai,
each through payonce with a 1 s timeout against a 2.5 s generation (conftest.py).

For each: the recipe of docs/recipes.md bills 1 per business request, run twice;
the framework as it ships, no key, bills 1 per call (the gateway matches the
SDK's retries), so 2 when the application re-runs the request; pointed straight
at the simulator, the recipe bills every attempt: 3 (9 for LangChain's\n``.with_retry()`` around the SDK's retries). LangChain's own
``.with_retry()`` loop bills 3 through the gateway as it ships and 1 with
``--dedupe-identical``. The frameworks run from their own virtualenv
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
NAMES = ["langchain-openai", "langchain-anthropic", "litellm", "openai-agents", "pydantic-ai"]

# Each framework as it ships, no key: only its base URL points at the gateway.
NO_CODE = {
    "langchain-openai": """
from langchain_openai import ChatOpenAI
llm = ChatOpenAI(model="gpt-4o-mini", base_url="http://127.0.0.1:8080/v1", timeout=60)
def handle(ticket):
    return llm.invoke(f"Summarise ticket {ticket}").content
""",
    "langchain-anthropic": """
from langchain_anthropic import ChatAnthropic
llm = ChatAnthropic(model="claude-sonnet-4-0", base_url="http://127.0.0.1:8080", timeout=60)
def handle(ticket):
    return llm.invoke(f"Summarise ticket {ticket}").content
""",
    "litellm": """
import litellm
def handle(ticket):
    return litellm.completion(
        model="openai/gpt-4o-mini", api_base="http://127.0.0.1:8080/v1", timeout=60,
        messages=[{"role": "user", "content": f"Summarise ticket {ticket}"}],
    ).choices[0].message.content
""",
    "openai-agents": """
from agents import Agent, Runner, set_default_openai_client
from openai import AsyncOpenAI
set_default_openai_client(AsyncOpenAI(base_url="http://127.0.0.1:8080/v1", timeout=60))
agent = Agent(name="triage", instructions="Summarise support tickets.", model="gpt-4o-mini")
def handle(ticket):
    return Runner.run_sync(agent, f"Summarise ticket {ticket}").final_output
""",
    "pydantic-ai": """
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
client = AsyncOpenAI(base_url="http://127.0.0.1:8080/v1", timeout=60)
agent = Agent(OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client)))
def handle(ticket):
    return agent.run_sync(f"Summarise ticket {ticket}").output
""",
}

# The recipe straight at the simulator: every attempt of every layer billed. LangChain's
# recipe has two layers, .with_retry() (3 attempts) around the SDK's (3 each).
WITHOUT = {name: 3 for name in NAMES} | {"langchain-openai": 9}

# LangChain's own retry loop around an SDK that does not retry: each attempt is a new call.
WITH_RETRY = """
from langchain_openai import ChatOpenAI
llm = ChatOpenAI(model="gpt-4o-mini", base_url="http://127.0.0.1:8080/v1", timeout=60, max_retries=0)
def handle(ticket):
    return llm.with_retry(stop_after_attempt=3).invoke(f"Summarise ticket {ticket}").content
"""


@pytest.fixture(scope="module")
def python() -> Path:
    return prepared(frameworks.FRAMEWORKS, "tests/recipes/test_frameworks.py") / "bin" / "python"


def ticket() -> str:
    """A business request of its own: the gateway and its keys are shared by the module."""
    return uuid.uuid4().hex[:8]


def run(python: Path, code: str, url: str, tmp_path: Path, *tickets: str) -> list[dict[str, Any]]:
    """The code (a recipe, or a framework as it ships) against ``url``, once per ticket."""
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


@pytest.mark.parametrize("name", NAMES)
def test_the_recipe_bills_once_per_business_request(
    name: str, python: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    # The business request, then the application running it again (a job retried).
    first, again = run(python, recipe(name, gateway.url), gateway.url, tmp_path, *[ticket()] * 2)
    assert first.get("answer"), first
    assert again == first, "the re-run got the stored answer"
    assert bills(sim) == 1


@pytest.mark.parametrize("name", NAMES)
def test_with_no_code_the_gateway_bills_once_per_call(
    name: str, python: Path, gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    first, again = run(python, NO_CODE[name], gateway.url, tmp_path, *[ticket()] * 2)
    assert first.get("answer") and again.get("answer"), (first, again)
    # Each call's timed-out attempts are matched to its first run (x-stainless-retry-count);
    # the re-run is a new call to the SDK, and without a key a new business request.
    assert bills(sim) == 2


def test_langchain_with_retry_bills_each_attempt_unless_deduped_or_keyed(
    python: Path, gateway: Process, dedupe_gateway: Process, sim: Sim, tmp_path: Path
) -> None:
    sim.reset()
    (outcome,) = run(python, WITH_RETRY, gateway.url, tmp_path, ticket())
    assert outcome.get("error") == "OpenAITimeoutError", outcome  # three first attempts, all late
    assert bills(sim) == 3
    (outcome,) = run(python, WITH_RETRY, dedupe_gateway.url, tmp_path, ticket())
    assert outcome.get("answer"), outcome  # the retries joined the first attempt's run
    assert bills(sim) == 1


# One framework's baseline is enough to show the timeouts force every layer's
# retries (the others' figures in docs/recipes.md were measured once by hand with
# this test: 90 s of the suite's 15 minutes).
BASELINES = ["litellm"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BASELINES)
def test_without_payonce_every_attempt_is_billed(
    name: str, python: Path, sim: Sim, tmp_path: Path
) -> None:
    """The recipe pointed straight at the simulator: the key is ignored, each attempt billed."""
    sim.reset()
    (outcome,) = run(python, recipe(name, sim.url), sim.url, tmp_path, ticket())
    assert "error" in outcome, outcome
    assert bills(sim) == WITHOUT[name]
