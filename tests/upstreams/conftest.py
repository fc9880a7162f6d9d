"""Real upstreams (marker ``real_upstream``): their servers are prepared before any test runs.

Making llama.cpp's virtualenv can take minutes (a first build of
llama-cpp-python), longer than a test's timeout: it is done once, after
collection, when a selected test has the marker, and reported on the terminal.
A preparation that fails fails those tests, with its log: they never skip.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.llama_cpp import Installation, prepare

_prepared: list[Installation | Exception] = []


def _prepare(say: Callable[[str], object] = print) -> None:
    try:
        _prepared.append(prepare(say))
    except Exception as exc:
        _prepared.append(exc)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or _prepared:
        return
    if not any(item.get_closest_marker("real_upstream") for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    _prepare(say)
    found = _prepared[-1]
    if isinstance(found, Installation):
        what = "built and installed" if found.built else "ready"
        say(f"real_upstream: llama.cpp's server {what} in {found.seconds:.1f} s")


@pytest.fixture(scope="session")
def llama_installation() -> Installation:
    """llama.cpp's server and the model, prepared after collection (above)."""
    if not _prepared:
        _prepare()
    found = _prepared[-1]
    if isinstance(found, Exception):
        pytest.fail(f"could not prepare llama.cpp's server: {found}", pytrace=False)
    return found
