"""What payonce.observe.counting uses of prometheus-client beyond its documented API
still exists in the installed release (``make test-latest`` lifts the version bound)."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, values

from payonce.observe.counting import CHECKED, INTERNALS


def _holders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A real multiprocess value (and its file) and a real histogram, by INTERNALS' names."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    value_class = values.MultiProcessValue(os.getpid)  # type: ignore[no-untyped-call]
    value = value_class("counter", "c", "c_total", (), (), "help")
    histogram = Histogram("h", "help", registry=CollectorRegistry())
    return {
        "values": values,
        "MmapedValue": value,
        "MmapedDict": value._file,
        "Histogram": histogram,
    }


def test_every_internal_used_is_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holders = _holders(tmp_path, monkeypatch)
    missing = [f"{owner}.{name}" for owner, name in INTERNALS if not hasattr(holders[owner], name)]
    version = importlib.metadata.version("prometheus-client")
    assert not missing, (
        f"prometheus-client {version} no longer has {missing}: payonce.observe.counting"
        f" was checked against {CHECKED}"
    )


def test_the_locked_release_is_one_that_was_checked() -> None:
    """uv.lock's release is in CHECKED: a lock moved by make upgrade names its release there."""
    version = importlib.metadata.version("prometheus-client")
    if os.environ.get("PAYONCE_TEST_LATEST"):
        pytest.skip(f"make test-latest: {version} is being tried, not checked yet")
    assert version in CHECKED, f"prometheus-client {version} is not in counting.CHECKED"
