"""A line chart against the client timeout, as one ``<svg>`` with no script.

The x axis is logarithmic (timeouts from a fraction of a second to minutes fit on
one chart), labelled on the 1-2-5 sequence; vertical markers show where the
configured and the recommended timeouts sit. Every point carries a ``<title>``:
hovering shows its exact value. Styled like :mod:`payonce.reconcile.charts`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

from payonce.reconcile.charts import nice_ceiling

__all__ = ["Line", "Marker", "timeout_chart"]

WIDTH = 720
HEIGHT = 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 20, 34, 48
_FONT = 'font-family="system-ui, sans-serif" font-size="12"'


@dataclass(frozen=True, slots=True)
class Line:
    """One series: a value per timeout of the chart, drawn in ``color``."""

    name: str
    values: Sequence[float]
    color: str
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class Marker:
    """A vertical line at ``timeout`` (the configured one, the recommended one)."""

    label: str
    timeout: float
    color: str


def _ticks(low: float, high: float) -> list[float]:
    ticks = []
    exponent = math.floor(math.log10(low))
    while 10**exponent <= high:
        for step in (1, 2, 5):
            value = step * 10.0**exponent
            if low <= value <= high:
                ticks.append(value)
        exponent += 1
    return ticks


def _tick_label(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:,.0f}s" if seconds >= 100 else f"{seconds:g}s"


def _bottom(values: Sequence[float]) -> float:
    # Success rates crowd near 100%: start the axis just below the lowest value.
    lowest = min(values, default=0.0)
    for floor in (0.99, 0.95, 0.9, 0.8, 0.5):
        if lowest >= floor + (1 - floor) * 0.05:
            return floor
    return 0.0


def timeout_chart(
    label: str,
    timeouts: Sequence[float],
    lines: Sequence[Line],
    markers: Sequence[Marker],
    fmt: Callable[[float], str],
    *,
    zoom: bool = False,
) -> str:
    """The lines against ``timeouts`` (seconds, increasing). ``zoom``: start the y axis
    below the lowest value instead of at 0 (for success rates near 100%)."""
    values = [value for line in lines for value in line.values]
    bottom = _bottom(values) if zoom else 0.0
    top = 1.0 if zoom else nice_ceiling(max(values, default=0.0))
    low, high = timeouts[0], timeouts[-1]
    plot_width = WIDTH - _LEFT - _RIGHT
    plot_height = HEIGHT - _TOP - _BOTTOM

    def x_of(seconds: float) -> float:
        return _LEFT + plot_width * math.log(seconds / low) / math.log(high / low)

    def y_of(value: float) -> float:
        return _TOP + plot_height * (1 - (value - bottom) / ((top - bottom) or 1.0))

    parts = []
    for i in range(5):
        value = bottom + (top - bottom) * i / 4
        y = y_of(value)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_width}" y1="{y:.1f}" y2="{y:.1f}"'
            ' stroke="#e3e6ea" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555" {_FONT}>'
            f"{escape(fmt(value))}</text>"
        )
    baseline = _TOP + plot_height
    for tick in _ticks(low, high):
        x = x_of(tick)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{baseline}" y2="{baseline + 4}" stroke="#999"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{baseline + 17}" text-anchor="middle" fill="#555" {_FONT}>'
            f"{escape(_tick_label(tick))}</text>"
        )
    parts.append(
        f'<text x="{_LEFT + plot_width / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle"'
        f' fill="#333" {_FONT}>client timeout (log scale)</text>'
    )
    for number, marker in enumerate(markers):
        if not low <= marker.timeout <= high:
            continue
        x = x_of(marker.timeout)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{baseline}" stroke="{marker.color}"'
            ' stroke-width="1.5" stroke-dasharray="4 3"/>'
        )
        # Labels right of the line, or left of it in the right third so they stay inside.
        right = x < _LEFT + plot_width * 0.66
        parts.append(
            f'<text x="{x + 4 if right else x - 4:.1f}" y="{_TOP + 12 + 14 * number}"'
            f' text-anchor="{"start" if right else "end"}" fill="{marker.color}" {_FONT}>'
            f"{escape(marker.label)}</text>"
        )
    for line in lines:
        points = [(x_of(t), y_of(v)) for t, v in zip(timeouts, line.values, strict=True)]
        dash = ' stroke-dasharray="7 4"' if line.dashed else ""
        parts.append(
            f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in points)}" fill="none"'
            f' stroke="{line.color}" stroke-width="2"{dash}/>'
        )
        parts += [
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{line.color}"><title>'
            f"{escape(line.name)} at {escape(_tick_label(t))}: {escape(fmt(v))}</title></circle>"
            for (x, y), t, v in zip(points, timeouts, line.values, strict=True)
        ]
    x = _LEFT
    for line in lines:
        parts.append(
            f'<line x1="{x}" x2="{x + 18}" y1="10" y2="10" stroke="{line.color}" stroke-width="2"'
            + (' stroke-dasharray="7 4"/>' if line.dashed else "/>")
        )
        parts.append(f'<text x="{x + 22}" y="14" fill="#333" {_FONT}>{escape(line.name)}</text>')
        x += 34 + 7 * len(line.name)
    return (
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img"'
        f' aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(parts)
        + "</svg>"
    )
