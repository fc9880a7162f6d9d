"""payonce: make a retried LLM API call cost the same as one call.

The parts live in one folder each: ``gateway/`` (the idempotency proxy),
``store/`` (where records live), ``sim/`` (the simulated LLM provider).
``cli.py`` is the only module that wires them together.
"""

from payonce.errors import PayonceError

__all__ = ["PayonceError", "__version__"]
__version__ = "0.2.0"
