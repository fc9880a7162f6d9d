"""What the gateway uses of uvicorn beyond its documented API still exists in the
installed release (payonce.gateway.uvicorn_internals; ``make test-latest`` lifts the
version bound to show what a newer release moved)."""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import re

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from payonce.gateway.uvicorn_internals import (
    CHECKED,
    CYCLE_MEMBERS,
    PROTOCOL_MEMBERS,
    SERVER_MEMBERS,
    HttpToolsProtocol,
)


def _missing(cls: type, names: tuple[str, ...]) -> list[str]:
    """Names neither defined on ``cls`` (or a base) nor assigned as ``self.<name>`` in it."""
    source = "".join(inspect.getsource(klass) for klass in cls.__mro__ if klass is not object)
    return [
        name
        for name in names
        if not hasattr(cls, name) and not re.search(rf"self\.{name}\s*[:=]", source)
    ]


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (HttpToolsProtocol, PROTOCOL_MEMBERS),
        (RequestResponseCycle, CYCLE_MEMBERS),
        (uvicorn.Server, SERVER_MEMBERS),
    ],
    ids=["protocol", "cycle", "server"],
)
def test_every_member_used_is_there(cls: type, names: tuple[str, ...]) -> None:
    version = importlib.metadata.version("uvicorn")
    missing = _missing(cls, names)
    assert not missing, (
        f"uvicorn {version}: {cls.__name__} no longer has {missing};"
        f" payonce.gateway.uvicorn_internals was checked against {CHECKED}"
    )


def test_a_member_that_is_not_there_is_found() -> None:
    """The check itself can fail."""
    assert _missing(HttpToolsProtocol, ("parser", "no_such_member")) == ["no_such_member"]


def test_the_locked_release_is_one_that_was_checked() -> None:
    version = importlib.metadata.version("uvicorn")
    if os.environ.get("PAYONCE_TEST_LATEST"):
        pytest.skip(f"make test-latest: {version} is being tried, not checked yet")
    assert version in CHECKED, f"uvicorn {version} is not in uvicorn_internals.CHECKED"
