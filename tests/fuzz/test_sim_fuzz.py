"""The simulator's request parsers, fed random bodies and control headers over HTTP.

Whatever arrives, the simulator answers as a provider does: a 2xx, or a 4xx in
the provider's own JSON error shape; never a 500 with a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2 as httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from payonce.sim.provider import ENDPOINTS, RESPONSES
from tests.fuzz.conftest import LIVE
from tests.support.sim import Sim

PATHS = [endpoint.path for endpoint in (*ENDPOINTS, RESPONSES)]
FIELDS = ["model", "messages", "prompt", "input", "max_tokens", "n", "stream", "stream_options",
          "max_output_tokens", "metadata", "system", "instructions", "temperature", "user",
          "encoding_format", "dimensions", "background", "store", "content", "role", "text"]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["gpt-4o-mini", "claude-3-5-haiku-latest", "user", "assistant"]),
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=6)
    ),
    max_leaves=20,
)
bodies = st.one_of(
    documents.map(lambda document: json.dumps(document).encode()),
    st.binary(max_size=64),
    st.integers(min_value=1, max_value=5000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(min_value=1, max_value=5000).map(
        lambda depth: b'{"a":' * depth + b"1" + b"}" * depth
    ),
)


@pytest.fixture(scope="module")
def client(fuzz_sim: Sim) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_sim.url, timeout=10) as session:
        yield session


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:300]
    if response.status_code >= 400:
        document = response.json()
        assert isinstance(document.get("error"), dict) or document.get("type") == "error"


@LIVE
@given(path=st.sampled_from(PATHS), body=bodies)
@example(path="/v1/chat/completions", body=b"[" * 100_000 + b"]" * 100_000)
@example(path="/v1/messages", body=b'{"a":' * 5000 + b"1" + b"}" * 5000)
@example(path="/v1/chat/completions", body=b"\xff\xfe{}")
def test_any_body_is_answered_as_a_provider_would(
    client: httpx.Client, path: str, body: bytes
) -> None:
    headers = {"Content-Type": "application/json", "X-Sim-Delay-Ms": "0", "X-Sim-Token-Ms": "0"}
    _check(client.post(path, content=body, headers=headers))


control = st.sampled_from(
    [
        "X-Sim-Delay-Ms",
        "X-Sim-Fail",
        "X-Sim-Drop",
        "X-Sim-Token-Ms",
        "X-Sim-Die-After",
        "X-Sim-No-Request-Id",
    ]
)
values = st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12),
    st.sampled_from(["nan", "inf", "-1", "1e400", "9" * 5000, "0x10", "1_0", "true", "600"]),
)


@LIVE
@given(name=control, value=values)
@example(name="X-Sim-Fail", value="503")
def test_any_control_header_is_answered_as_a_provider_would(
    client: httpx.Client, name: str, value: str
) -> None:
    if name == "X-Sim-Drop":
        value = "0"  # a drop closes the connection on purpose
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    headers = {name: value, "X-Sim-Token-Ms": "0"}
    if name != "X-Sim-Delay-Ms":
        headers["X-Sim-Delay-Ms"] = "0"
    if name in ("X-Sim-Delay-Ms", "X-Sim-Token-Ms"):
        try:
            if float(value) > 50:
                return  # a real pause: not what this test is for
        except ValueError:
            pass
    response = client.post("/v1/chat/completions", json=body, headers=headers)
    if name == "X-Sim-Fail" and value.isdigit() and len(value) == 3 and 400 <= int(value) <= 599:
        assert response.status_code == int(value), "the fault asked for"
        return
    _check(response)
