"""False positives measured on real packages (tests/lint/labelled/findings.csv) not yet fixed.

Each is the published code's shape, cut down. They are strict xfails: the day
one stops being reported, the test fails and the label must be read again.
The fixed ones are negative fixtures (not_llm_urls.py, recursive_retry.py,
stacked_app_retries.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from payonce.lint import lint_file
from payonce.lint.engine import FileKind

READINESS_POLL = """
import time
from openai import OpenAI

def wait_for_deployment(host, model_name, deploy_timeout):
    client = OpenAI(base_url=f"{host}/serving-endpoints")
    for _ in range(deploy_timeout // 60):
        try:
            client.chat.completions.create(messages=[], model=model_name, max_tokens=1)
            return
        except Exception:
            time.sleep(60)
"""

REFORMAT_LOOP = """
import openai

def completion(client, messages):
    for _ in range(2):
        try:
            return client.post("/chat/completions", body={"messages": messages})
        except Exception as e:
            if "roles must alternate" in str(e):
                messages = [message for message in messages if message]
            else:
                raise e
"""


def codes(tmp_path: Path, source: str) -> set[str]:
    path = tmp_path / "module.py"
    path.write_text(source)
    return {finding.code for finding in lint_file(str(path), FileKind.PYTHON)}


@pytest.mark.xfail(strict=True, reason="dspy 3.4.1 databricks.py:152: a readiness poll")
def test_a_readiness_poll_is_not_a_retry(tmp_path: Path) -> None:
    assert codes(tmp_path, READINESS_POLL) <= {"PO202"}


@pytest.mark.xfail(strict=True, reason="litellm 1.110.2 openai.py:563: a 400 re-sent changed")
def test_a_loop_that_goes_round_on_a_rejected_request_is_not_a_retry(tmp_path: Path) -> None:
    assert "PO201" not in codes(
        tmp_path, REFORMAT_LOOP.replace('"/chat', '"https://api.openai.com/v1/chat')
    )
