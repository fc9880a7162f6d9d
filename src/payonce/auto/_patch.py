"""Make every official SDK client in this process send its own per-call key.

The Stainless-generated SDKs (``openai``, ``anthropic``) mint one idempotency
key per call, reuse it on every retry of that call, and send it only when the
client's ``_idempotency_header`` names a header; their ``BaseClient.__init__``
sets it to ``None``. Setting it on one client is lost on ``with_options()`` and
``copy()``, which build a new client through ``__init__`` (frameworks do that
internally). So the patch is on ``__init__`` itself: every client, copies
included, gets the header, unless the application chose one.

The SDK modules are patched when they are imported (a post-import hook on
``sys.meta_path``, as ``wrapt`` does) or at once when already imported; the
SDKs are never imported here, so a process that does not use one pays nothing.

This module imports nothing outside the standard library and keeps to syntax
Python 3.8 reads: ``payonce run`` loads it by its path into applications whose
environment may have neither payonce nor its dependencies.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
from typing import Any, Dict, Iterator, Optional, Sequence

__all__ = [
    "DEFAULT_HEADER",
    "HEADER_ENV",
    "SCENARIO_ENV",
    "SCENARIO_HEADER",
    "SDKS",
    "install",
    "patched",
    "scenario",
]

DEFAULT_HEADER = "Idempotency-Key"
# Read when the hook is installed; `payonce run --key-header` sets it.
HEADER_ENV = "PAYONCE_KEY_HEADER"
# The modules that define the SDKs' BaseClient (the same in openai 1.x-3.x and
# anthropic 1.x-2.x).
SDKS = ("openai._base_client", "anthropic._base_client")

# Marks a patched __init__, so that two copies of this module (one loaded by
# path by `payonce run`, one imported as payonce.auto) never patch twice.
_MARK = "__payonce_auto_header__"
_lock = threading.Lock()
_header: Dict[str, str] = {}
# The business scenario each request names (docs/observability.md, "Cost by endpoint
# and scenario"): the innermost scenario() around the call, else $PAYONCE_SCENARIO
# (`payonce run --scenario`), read at each call.
SCENARIO_HEADER = "X-Payonce-Scenario"
SCENARIO_ENV = "PAYONCE_SCENARIO"
# One context variable per process, shared by both copies of this module (the one
# `payonce run` loads by path and payonce.auto): the application's scenario() sets
# the variable the patched clients read, whichever copy patched them.
_STATE = sys.modules.get("_payonce_auto_state")
if _STATE is None:
    _STATE = types.ModuleType("_payonce_auto_state")
    _STATE.scenario = contextvars.ContextVar("payonce_scenario", default=None)  # type: ignore[attr-defined]
    sys.modules["_payonce_auto_state"] = _STATE
_SCENARIO: "contextvars.ContextVar[Optional[str]]" = _STATE.scenario


@contextlib.contextmanager
def scenario(name: str) -> Iterator[None]:
    """Every SDK call inside names ``name`` as its business scenario (``X-Payonce-Scenario``).

    A context variable: each thread and asyncio task has its own, and the
    innermost ``with`` wins.
    """
    token = _SCENARIO.set(name)
    try:
        yield
    finally:
        _SCENARIO.reset(token)


def install(header: Optional[str] = None) -> None:
    """Patch the SDKs now if imported, else when they are (idempotent).

    ``header``: the header to send the key in (default: ``$PAYONCE_KEY_HEADER``,
    else ``Idempotency-Key``).
    """
    chosen = header or os.environ.get(HEADER_ENV) or DEFAULT_HEADER
    with _lock:
        _header["name"] = chosen
        for name in SDKS:
            module = sys.modules.get(name)
            if module is not None:
                _patch(module)
        if not any(isinstance(finder, _PostImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _PostImport())


def patched(module: types.ModuleType) -> Optional[str]:
    """The header ``module``'s clients were patched to send, or ``None``."""
    base = getattr(module, "BaseClient", None)
    init = getattr(base, "__init__", None)
    value = getattr(init, _MARK, None)
    return value if isinstance(value, str) else None


def _patch(module: types.ModuleType) -> None:
    base = getattr(module, "BaseClient", None)
    if base is None or patched(module) is not None:
        return  # an SDK too old to have the key, or done already
    original = base.__init__
    header = _header["name"]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        # The SDK's __init__ sets None; anything else was chosen after it
        # (protect(), a subclass): keep it.
        if getattr(self, "_idempotency_header", None) is None:
            self._idempotency_header = header

    setattr(__init__, _MARK, header)
    base.__init__ = __init__
    build = getattr(base, "_build_headers", None)
    if build is not None:
        base._build_headers = _naming_scenario(build)


def _naming_scenario(build: Any) -> Any:
    """``_build_headers`` that adds the scenario, unless the call set the header itself."""

    @functools.wraps(build)
    def _build_headers(self: Any, *args: Any, **kwargs: Any) -> Any:
        headers = build(self, *args, **kwargs)
        name = _SCENARIO.get() or os.environ.get(SCENARIO_ENV)
        if name and SCENARIO_HEADER not in headers:
            headers[SCENARIO_HEADER] = name
        return headers

    return _build_headers


class _Patching(importlib.abc.Loader):
    """The SDK module's own loader, then the patch."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            _patch(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _PostImport(importlib.abc.MetaPathFinder):
    """Finds an SDK's module with the other finders and wraps its loader."""

    def find_spec(
        self,
        fullname: str,
        path: Optional[Sequence[str]],
        target: Optional[types.ModuleType] = None,
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in SDKS:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _PostImport):
                continue
            find = getattr(finder, "find_spec", None)
            spec: Optional[importlib.machinery.ModuleSpec] = (
                find(fullname, path, target) if find is not None else None
            )
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Patching(spec.loader)
                return spec
        return None
