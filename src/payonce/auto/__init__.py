"""``import payonce.auto``: every ``openai``/``anthropic`` client sends its own per-call key.

Import it once, before or after the SDKs, in a process started any way (a
server's entry point, a worker's initialiser)::

    import payonce.auto  # noqa: F401

From then on every SDK client the process builds, and every copy made with
``with_options()`` or ``copy()``, sends the key the SDK mints for a call in
``Idempotency-Key`` (``$PAYONCE_KEY_HEADER`` to name another), the same key on
each of that call's retries. A payonce gateway then runs the call once
however many times the SDK sends it. Nothing else changes: the base URL, the
timeouts and ``max_retries`` stay the application's (``payonce run`` also
points the SDKs at the gateway). See docs/client.md, "No code: payonce run".

``with payonce.auto.scenario("invoice-summary"):`` names the business scenario of
the SDK calls inside (``X-Payonce-Scenario``; ``payonce run --scenario NAME``, or
``$PAYONCE_SCENARIO``, for the whole process).
"""

from payonce.auto._patch import (
    DEFAULT_HEADER,
    HEADER_ENV,
    SCENARIO_ENV,
    SCENARIO_HEADER,
    SDKS,
    install,
    patched,
    scenario,
)

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

install()
