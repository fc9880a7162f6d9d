"""Fuzz tests: hypothesis with bounded examples, so the whole folder costs seconds.

``FUZZ`` is the budget of one property over pure functions; ``LIVE`` the budget
of one property whose examples each cross a socket to a real process. Neither
shrinks for long: a failing example is printed and becomes a regression test.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

FUZZ = settings(max_examples=100, deadline=None)
LIVE = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
