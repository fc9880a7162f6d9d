"""Real upstreams (markers ``real_upstream``, ``litellm``): prepared before any test runs.

Making llama.cpp's virtualenv can take many minutes (a first build of
llama-cpp-python), longer than a test's timeout: ``make test`` makes it first
(``python -m tests.support.prepare``), and a bare ``pytest`` run before the first
test that needs it, on its terminal (``tests/conftest.py``). A preparation that
fails fails those tests, with its log: they never skip.

When a server under test has died, a failing test says so (its exit status and
the last lines of its log), not only what its client saw ("Connection refused").
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.support import prepare
from tests.support.llama_cpp import Installation, NotPrepared
from tests.support.llama_cpp import prepare as prepare_llama
from tests.support.processes import Process


@pytest.fixture(scope="session")
def llama_installation(request: pytest.FixtureRequest) -> Installation:
    """llama.cpp's server and the model, prepared before the tests (above)."""
    failed = prepare.failed("tests/upstreams/test_llama_cpp.py")
    if failed is not None:
        pytest.fail(f"could not prepare llama.cpp's server: {failed}", pytrace=False)
    # An xdist worker never builds: its output is never shown, and a build outlasts
    # a test's timeout. The controller prepared it before handing out any test.
    worker = hasattr(request.config, "workerinput")
    try:
        return prepare_llama(make=not worker)
    except NotPrepared as exc:
        message = (
            f"{exc} (its preparation failed, see the lines printed before the tests;"
            " or run `python -m tests.support.prepare`)"
        )
    except Exception as exc:
        message = f"could not prepare llama.cpp's server: {exc}"
    pytest.fail(message, pytrace=False)  # outside the handlers: no chained traceback


def _processes(item: pytest.Item) -> Iterator[Process]:
    """The servers this test uses: its fixtures that are, or hold, a process."""
    for value in getattr(item, "funcargs", {}).values():
        found = value if isinstance(value, Process) else getattr(value, "process", None)
        if isinstance(found, Process):
            yield found


class ServerDied(Exception):
    """A server the failing test used had exited."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except Exception as exc:
        deaths = [death for process in _processes(item) if (death := process.exited())]
        if deaths:
            raise ServerDied("\n\n".join(deaths)) from exc
        raise
