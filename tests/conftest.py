"""Fixtures shared by every test package: one fast simulator per module."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from tests.support.prepare import prepare_for_tests
from tests.support.sim import Sim, running_sim


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/soak/conftest.py: pytest reads options only from the
    # conftest files it loads before collecting.
    parser.addoption(
        "--soak-minutes",
        type=float,
        default=float(os.environ.get("PAYONCE_SOAK_MINUTES", "1.5")),
        help="how long the soak (tests/soak, marker soak) drives traffic; default 1.5,"
        " or PAYONCE_SOAK_MINUTES",
    )


def _say(config: pytest.Config) -> Callable[[str], object]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return print

    def say(line: str) -> None:
        reporter.ensure_newline()  # after xdist's "bringing up nodes..."
        reporter.write_line(line)
        reporter.flush()

    return say


# What the selected tests need beyond payonce's virtualenv (LiteLLM's, llama.cpp's:
# minutes the first time), made before the first test and told on the terminal
# that started pytest (tests/support/prepare.py). Here, not in tests/upstreams:
# under xdist the controller collects nothing, so loads no conftest below this one.
def pytest_collection_finish(session: pytest.Session) -> None:
    """Without xdist: once the tests are collected (and deselected)."""
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly:
        return  # a worker's output is never shown: the controller does it (below)
    prepare_for_tests((item.nodeid for item in session.items), _say(config))


_prepared_by_controller: list[bool] = []


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    """Under xdist, in the controller: when the first worker has collected, before
    any test is handed out (workers wait meanwhile; all collect the same tests)."""
    if _prepared_by_controller:
        return
    _prepared_by_controller.append(True)
    prepare_for_tests(ids, _say(node.config))


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One fast simulator (``--latency fixed:0 --seed 7``) shared by a test module."""
    with running_sim(
        "--latency", "fixed:0", "--seed", "7", log_dir=tmp_path_factory.mktemp("sim")
    ) as sim:
        yield sim


@pytest.fixture
def fresh_sim(sim: Sim) -> Sim:
    """The shared simulator with an empty ledger."""
    sim.reset()
    return sim
