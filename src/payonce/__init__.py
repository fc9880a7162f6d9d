"""payonce: make a retried LLM API call cost the same as one call.

The parts live in one folder each: ``gateway/`` (the idempotency proxy),
``store/`` (where records live), ``observe/``, ``client/``, ``auto/``, ``sim/``,
``lint/``, ``reconcile/``, ``simulate/``, ``demo/`` and ``torture/``. ``cli.py``
is the only module that wires them together. What each is, and a request's path
through them: docs/design.md.
"""

from payonce.errors import PayonceError

__all__ = ["PayonceError", "__version__"]
__version__ = "0.2.0"
