"""Choosing and describing a stack of retry layers."""

from __future__ import annotations

from payonce.lint.retries import RetryLayer

__all__ = ["describe_stack", "worst_stack"]


def worst_stack(stacks: list[tuple[RetryLayer, ...]]) -> tuple[RetryLayer, ...]:
    """The stack that can bill the most: most layers, then the largest known product."""
    if not stacks:
        return ()

    def score(stack: tuple[RetryLayer, ...]) -> tuple[int, int]:
        product = 1
        for layer in stack:
            product *= layer.attempts if layer.attempts is not None else 1
        return len(stack), product

    return max(stacks, key=score)


def describe_stack(layers: tuple[RetryLayer, ...]) -> str:
    """``tenacity @retry on line 3 (5 attempts) x for-loop retry on line 9 (3 attempts)``."""
    return " x ".join(layer.describe() for layer in layers)
