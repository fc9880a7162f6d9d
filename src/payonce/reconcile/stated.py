"""Costs the provider stated itself, beside their list price (``stated_costs``).

The gateway prices a call by the cost its response states when there is one
(OpenRouter's ``usage.cost``: ``price_source`` ``provider`` in the call log) and
logs the same call at its list price beside it (``list_cost_usd``, from
``--prices`` or genai-prices). Finance sees both: how many calls the provider
priced, what it said they cost, what the list prices say, and the difference.
"""

from __future__ import annotations

from payonce.reconcile.engine import Engine
from payonce.reconcile.report import StatedCosts

__all__ = ["stated_costs"]

# The calls whose cost the provider stated: not the replays and joins, which cost 0
# (their saved_usd is the stated cost of the call they repeat).
_STATED = """
SELECT count(*),
       coalesce(sum(cost_usd), 0),
       count(list_cost_usd),
       coalesce(sum(cost_usd) FILTER (WHERE list_cost_usd IS NOT NULL), 0),
       coalesce(sum(list_cost_usd), 0)
FROM calls
WHERE price_source = 'provider' AND cost_usd IS NOT NULL
  AND coalesce(outcome NOT IN ('replayed', 'joined'), true)
"""


def stated_costs(engine: Engine) -> StatedCosts:
    """The ``stated_costs`` figure of the call logs loaded into ``calls``."""
    [row] = engine.rows(_STATED)
    calls, stated, listed_calls, stated_listed, listed = row
    return StatedCosts(
        calls=int(calls),
        stated_cost_usd=stated,
        calls_with_list_price=int(listed_calls),
        compared_stated_cost_usd=stated_listed,
        list_cost_usd=listed,
    )
