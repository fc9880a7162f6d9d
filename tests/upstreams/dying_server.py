"""Run only by ``test_llama_cpp.py``, in a pytest of its own: a test whose server dies under it.

Not collected with the suite (its name is not ``test_*.py``): its first test is
meant to fail. ``test_a_test_whose_server_died_says_so`` reads what pytest
printed for it, the way a developer would.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.llama_cpp import Installation, LlamaServer, start_server


@pytest.fixture
def server(llama_installation: Installation, tmp_path: Path) -> Iterator[LlamaServer]:
    with start_server(llama_installation, tmp_path) as started:
        yield started


def test_the_server_crashes_under_it(server: LlamaServer) -> None:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="sk-x", max_retries=0) as client:
        assert client.models.list().data, "it answered before"
        # What llama.cpp's GP fault in llama_decode did to the server.
        os.kill(server.process.popen.pid, signal.SIGSEGV)
        server.process.popen.wait(30)
        client.completions.create(model=server.model, prompt="Hello", max_tokens=1)


def test_the_next_test_is_not_failed_by_what_the_dead_server_left() -> None:
    # A socket the test above left open would warn when collected (and
    # filterwarnings = error makes a warning here this test's failure).
    gc.collect()
