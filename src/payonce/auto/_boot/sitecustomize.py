"""Started by ``payonce run`` (first on ``PYTHONPATH``): install the SDK patch, then
run the ``sitecustomize`` this one hides, if the environment has one.

payonce may not be installed in the application's environment, so the patch
module is loaded by its path, beside this folder (it needs only the standard
library). A failure here must not stop the application: it is reported on
stderr, and the application runs unprotected.
"""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _install() -> None:
    path = os.path.join(os.path.dirname(_here), "_patch.py")
    spec = importlib.util.spec_from_file_location("_payonce_auto_patch", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.install()


def _chain() -> None:
    # The next sitecustomize on the path (a virtualenv's or the distribution's):
    # this folder leaves sys.path (no other module lives in it) before the import.
    this = sys.modules.pop("sitecustomize")
    for entry in [entry for entry in sys.path if os.path.abspath(entry or ".") == _here]:
        sys.path.remove(entry)
    try:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = this


try:
    _install()
except Exception as exc:  # noqa: BLE001 - never stop the application
    print(f"payonce run: the SDK key patch was not installed: {exc}", file=sys.stderr)
_chain()
