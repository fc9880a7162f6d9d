"""Reading a Prometheus text exposition in tests."""

from __future__ import annotations

import re

__all__ = ["metric"]


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition, 0 when absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:]+)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        got = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
        if got == wanted:
            return float(match.group(3))
    return 0.0
