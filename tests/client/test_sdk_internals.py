"""The official SDKs' private parts that protect() uses (payonce.client._sdk) are
still there, on real clients of the installed releases."""

from __future__ import annotations

import importlib.metadata
import os

import anthropic
import openai
import pytest

from payonce.client import _sdk

CLIENTS = [openai.OpenAI, openai.AsyncOpenAI, anthropic.Anthropic, anthropic.AsyncAnthropic]


@pytest.mark.parametrize("make", CLIENTS, ids=lambda make: make.__name__)
def test_every_private_part_used_is_there(make: type) -> None:
    client = make(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    package = make.__module__.split(".")[0]
    version = importlib.metadata.version(package)
    missing = [name for name in _sdk.PRIVATE if not hasattr(client, name)]
    assert not missing, f"{package} {version} has no {missing}; checked: {_sdk.CHECKED[package]}"
    assert _sdk.http_client(client) is not None
    assert _sdk.idempotency_header(client) is None  # minted, not sent, by default
    _sdk.set_idempotency_header(client, "Idempotency-Key")
    assert _sdk.idempotency_header(client) == "Idempotency-Key"


@pytest.mark.parametrize("package", sorted(_sdk.CHECKED))
def test_the_locked_release_is_one_that_was_checked(package: str) -> None:
    version = importlib.metadata.version(package)
    if os.environ.get("PAYONCE_TEST_LATEST"):
        pytest.skip(f"make test-latest: {package} {version} is being tried, not checked yet")
    assert version in _sdk.CHECKED[package], f"{package} {version} is not in _sdk.CHECKED"
