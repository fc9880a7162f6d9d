"""Small SVG charts drawn in Python, so the HTML report needs no script and no network.

Each function returns one ``<svg>`` element sized by its ``viewBox`` (it scales
with the page). Every bar and point carries a ``<title>``: hovering shows the
exact value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Series", "horizontal_bars", "line_chart", "lines_chart", "stacked_bars"]

WIDTH = 720
HEIGHT = 280
_LEFT, _RIGHT, _TOP, _BOTTOM = 78, 16, 30, 62
_FONT = 'font-family="system-ui, sans-serif" font-size="12"'


@dataclass(frozen=True, slots=True)
class Series:
    """One series of values, one per category, drawn in ``color``."""

    name: str
    values: Sequence[float]
    color: str


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k not below ``value`` (the axis top)."""
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        candidate = step * 10**exponent
        if candidate >= value * (1 - 1e-12):
            return float(candidate)
    return float(10 ** (exponent + 1))


def _axis(top: float, fmt: Callable[[float], str], plot_width: int) -> list[str]:
    parts = []
    plot_height = HEIGHT - _TOP - _BOTTOM
    for i in range(5):
        value = top * i / 4
        y = _TOP + plot_height - plot_height * i / 4
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_width}" y1="{y:.1f}" y2="{y:.1f}"'
            ' stroke="#e3e6ea" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555" {_FONT}>'
            f"{escape(fmt(value))}</text>"
        )
    return parts


def _labels(categories: Sequence[str], slot: float) -> list[str]:
    parts = []
    every = max(1, math.ceil(len(categories) / 14))  # at most ~14 labels fit
    baseline = HEIGHT - _BOTTOM
    for i, label in enumerate(categories):
        if i % every:
            continue
        x = _LEFT + slot * (i + 0.5)
        parts.append(
            f'<text x="{x:.1f}" y="{baseline + 16}" text-anchor="end" fill="#555" {_FONT}'
            f' transform="rotate(-30 {x:.1f} {baseline + 16})">{escape(label)}</text>'
        )
    return parts


def _legend(series: Sequence[Series]) -> list[str]:
    parts = []
    x = _LEFT
    for item in series:
        parts.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{item.color}"/>')
        parts.append(f'<text x="{x + 14}" y="13" fill="#333" {_FONT}>{escape(item.name)}</text>')
        x += 24 + 7 * len(item.name)
    return parts


def _svg(parts: list[str], label: str, height: int = HEIGHT) -> str:
    return (
        f'<svg viewBox="0 0 {WIDTH} {height}" width="100%" role="img"'
        f' aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(parts)
        + "</svg>"
    )


def stacked_bars(
    label: str, categories: Sequence[str], series: Sequence[Series], fmt: Callable[[float], str]
) -> str:
    """Bars per category, series stacked bottom-up (spend = needed + wasted)."""
    totals = [sum(item.values[i] for item in series) for i in range(len(categories))]
    top = nice_ceiling(max(totals, default=0.0))
    plot_width = WIDTH - _LEFT - _RIGHT
    plot_height = HEIGHT - _TOP - _BOTTOM
    slot = plot_width / max(1, len(categories))
    bar = max(2.0, min(48.0, slot * 0.7))
    parts = _axis(top, fmt, plot_width)
    for i, category in enumerate(categories):
        y = float(_TOP + plot_height)
        for item in series:
            value = item.values[i]
            height = plot_height * value / top if top else 0.0
            y -= height
            x = _LEFT + slot * i + (slot - bar) / 2
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{height:.1f}"'
                f' fill="{item.color}"><title>{escape(category)}: {escape(item.name)}'
                f" {escape(fmt(value))}</title></rect>"
            )
    parts += _labels(categories, slot)
    parts += _legend(series)
    return _svg(parts, label)


def line_chart(
    label: str,
    categories: Sequence[str],
    values: Sequence[float | None],
    color: str,
    fmt: Callable[[float], str],
) -> str:
    """A line through the known values, broken where a value is unknown."""
    top = nice_ceiling(max((value for value in values if value is not None), default=0.0))
    plot_width = WIDTH - _LEFT - _RIGHT
    plot_height = HEIGHT - _TOP - _BOTTOM
    slot = plot_width / max(1, len(categories))
    parts = _axis(top, fmt, plot_width)
    runs: list[list[str]] = [[]]
    points = []
    for i, value in enumerate(values):
        if value is None:
            runs.append([])
            continue
        x = _LEFT + slot * (i + 0.5)
        y = _TOP + plot_height - plot_height * value / top
        runs[-1].append(f"{x:.1f},{y:.1f}")
        points.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}">'
            f"<title>{escape(categories[i])}: {escape(fmt(value))}</title></circle>"
        )
    parts += [
        f'<polyline points="{" ".join(run)}" fill="none" stroke="{color}" stroke-width="2"/>'
        for run in runs
        if len(run) > 1
    ]
    parts += points
    parts += _labels(categories, slot)
    return _svg(parts, label)


def horizontal_bars(
    label: str, items: Sequence[tuple[str, float]], color: str, fmt: Callable[[float], str]
) -> str:
    """One labelled horizontal bar per item (duplicate ratio by model)."""
    row = 26
    height = _TOP + row * max(1, len(items)) + 10
    left = 170
    plot_width = WIDTH - left - 90
    top = nice_ceiling(max((value for _, value in items), default=0.0))
    parts = []
    for i, (name, value) in enumerate(items):
        y = _TOP + row * i
        width = plot_width * value / top if top else 0.0
        shown = name if len(name) <= 24 else name[:23] + "…"
        parts.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" fill="#333" {_FONT}>'
            f"{escape(shown)}</text>"
        )
        parts.append(
            f'<rect x="{left}" y="{y + 3}" width="{max(width, 1.0):.1f}" height="{row - 8}"'
            f' fill="{color}"><title>{escape(name)}: {escape(fmt(value))}</title></rect>'
        )
        parts.append(
            f'<text x="{left + width + 6:.1f}" y="{y + 15}" fill="#333" {_FONT}>'
            f"{escape(fmt(value))}</text>"
        )
    return _svg(parts, label, height)


def lines_chart(
    label: str,
    categories: Sequence[str],
    series: Sequence[Series],
    fmt: Callable[[float], str],
) -> str:
    """Several lines over the same categories (billed against logged, per bucket).

    No markers: a year of hourly buckets is thousands of points; a caller with
    that many gathers them first (see ``usage_html``).
    """
    top = nice_ceiling(max((max(item.values, default=0.0) for item in series), default=0.0))
    plot_width = WIDTH - _LEFT - _RIGHT
    plot_height = HEIGHT - _TOP - _BOTTOM
    slot = plot_width / max(1, len(categories))
    parts = _axis(top, fmt, plot_width)
    for item in series:
        points = " ".join(
            f"{_LEFT + slot * (i + 0.5):.1f},{_TOP + plot_height - plot_height * v / top:.1f}"
            for i, v in enumerate(item.values)
        )
        dash = ' stroke-dasharray="5 3"' if item is not series[0] else ""
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{item.color}"'
            f' stroke-width="2"{dash}><title>{escape(item.name)}</title></polyline>'
        )
    parts += _labels(categories, slot)
    parts += _legend(series)
    return _svg(parts, label)
