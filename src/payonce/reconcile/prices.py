"""Bill lines priced from the price table: the model name as a bill writes it, then as
the table knows it (Bedrock ids, cross-region profiles, ARNs)."""

from __future__ import annotations

import re
from decimal import Decimal

from payonce.observe.pricing import ModelPrice, price_of
from payonce.reconcile.engine import Engine, sql_string

__all__ = ["MONEY", "bill_price", "price_bill_lines"]

MONEY = "DECIMAL(18,10)"

# Bedrock names a model by id (anthropic.claude-3-5-haiku-20241022-v1:0), by a
# cross-region inference profile (us.anthropic...) or by an ARN ending in either.
_PROFILE_PREFIX = re.compile(r"^(?:us|eu|apac|us-gov|global|jp|au|ca)\.")
_PER_TOKEN = Decimal(1_000_000)


def bill_price(model: str) -> ModelPrice | None:
    """The price table's entry for a bill's model name, Bedrock ids included.

    The name itself first (gpt-4o-2024-08-06, amazon.nova-micro-v1:0), then
    without an ARN's path and a cross-region profile's prefix, then an
    ``anthropic.`` id as Anthropic's own name (Bedrock lists Claude at
    Anthropic's prices).
    """
    price = price_of(model)
    if price is not None:
        return price
    name = _PROFILE_PREFIX.sub("", model.rsplit("/", 1)[-1])
    price = price_of(name)
    if price is None and name.startswith("anthropic."):
        price = price_of(name.removeprefix("anthropic."))
    return price


def price_bill_lines(engine: Engine, src: int) -> None:
    """Give one priced source's bill lines (``src``) their cost: tokens at the table's rates.

    A line without token counts, or whose model has no price, is malformed
    rather than free.
    """
    engine.execute(
        "UPDATE bill SET reason = CASE WHEN model IS NULL THEN 'no model to price'"
        " ELSE 'no token counts to price' END WHERE src = "
        f"{src} AND reason IS NULL AND (model IS NULL"
        " OR (input_tokens IS NULL AND output_tokens IS NULL))"
    )
    models = [
        str(row[0])
        for row in engine.rows(
            f"SELECT DISTINCT model FROM bill WHERE src = {src} AND reason IS NULL"
        )
    ]
    rates = []
    for model in models:
        price = bill_price(model)
        if price is not None:
            per_in = Decimal(str(price.input)) / _PER_TOKEN
            per_out = Decimal(str(price.output)) / _PER_TOKEN
            rates.append(f"({sql_string(model)}, {per_in:f}, {per_out:f})")
    table = f"prices_{src}"
    engine.execute(
        f"CREATE TEMP TABLE {table} (model VARCHAR, input DECIMAL(18,15), output DECIMAL(18,15))"
    )
    if rates:
        engine.execute(f"INSERT INTO {table} VALUES {', '.join(rates)}")
    engine.execute(
        f"UPDATE bill SET cost_usd = CAST(coalesce(input_tokens, 0) * p.input"
        f" + coalesce(output_tokens, 0) * p.output AS {MONEY}) FROM {table} p"
        f" WHERE bill.src = {src} AND bill.reason IS NULL AND bill.model = p.model"
    )
    engine.execute(
        "UPDATE bill SET reason = 'no price for model ' || model"
        f" WHERE src = {src} AND reason IS NULL AND cost_usd IS NULL"
    )
    engine.execute(f"DROP TABLE {table}")
