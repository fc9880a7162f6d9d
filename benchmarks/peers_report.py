"""The table and the chart of ``benchmarks/peers.py``, from its JSON document.

``python benchmarks/peers_report.py peers.json [chart.svg]`` prints the table again
and rewrites the chart from a saved run. The chart is plain SVG written here (no
plotting library): CPU per request (log scale) and billed generations per business
request, the median of the rounds with a bar from min to max.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

LOADS = {"nokey": "pass-through", "first": "keyed first call", "replay": "replay"}


def _range(stat: dict[str, Any] | None, spec: str, scale: float = 1.0) -> str:
    """``median (min-max)``, or ``-``."""
    if not stat or stat.get("median") is None:
        return "-"
    median, low, high = (stat[k] * scale for k in ("median", "min", "max"))
    if f"{low:{spec}}" == f"{high:{spec}}":
        return f"{median:{spec}}"
    return f"{median:{spec}} ({low:{spec}}-{high:{spec}})"


def _value(value: float | None, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}}"


def _median(rows: dict[str, Any], name: str, key: str) -> float | None:
    row = rows.get(name)
    return row[key]["median"] if row else None


def ratios(report: dict[str, Any]) -> list[tuple[str, float, str]]:
    """The issue's targets as (what, ratio, target) from workload 1's medians."""
    rows = report["results"].get("workload1", {})
    first = _median(rows, "payonce-sqlite first", "cpu_us")
    found = []
    nginx = _median(rows, "nginx first", "cpu_us")
    litellm = _median(rows, "litellm first", "cpu_us")
    if first and nginx:
        found.append(("payonce keyed first call (SQLite) / nginx, CPU per request",
                      first / nginx, "at most 10x"))  # fmt: skip
    if first and litellm:
        found.append(("LiteLLM / payonce keyed first call (SQLite), CPU per request",
                      litellm / first, "at least 50x"))  # fmt: skip
    redis = _median(rows, "payonce-redis first", "cpu_us")
    if redis and nginx:
        found.append(("payonce keyed first call (Redis) / nginx, CPU per request",
                      redis / nginx, "-"))  # fmt: skip
    with_store = {  # the gateway's CPU plus its store's (SQLite's is in the gateway)
        store: _median(rows, f"payonce-{store} first", "cpu_us_with_store")
        for store in ("redis", "postgres")
    }
    for store, cpu in with_store.items():
        if first and cpu:
            target = "at most 1.5x" if store == "postgres" else "-"
            found.append((f"payonce keyed first call ({store}, its server's CPU added) / SQLite's,"
                          " CPU per request", cpu / first, target))  # fmt: skip
    for store in (
        "sqlite",
        "redis",
        "postgres",
    ):  # --baseline-src: this checkout against an earlier one
        for load in ("first", "nokey", "replay"):
            now = _median(rows, f"payonce-{store} {load}", "cpu_us")
            before = _median(rows, f"payonce-{store}-baseline {load}", "cpu_us")
            if now and before:
                found.append((f"payonce {store} {load} / its baseline, CPU per request",
                              now / before, "-"))  # fmt: skip
    return found


def table(report: dict[str, Any]) -> str:
    """Markdown tables of every workload in ``report``."""
    results, out = report["results"], []
    nginx = _median(results.get("workload1", {}), "nginx first", "cpu_us")
    if "workload1" in results:
        out += ["", "| system | load | CPU µs/request | its store's µs | xnginx | requests/s"]
        out[-1] += " | p50 ms | p99 ms | waited for a core |"
        out += ["|---|---|--:|--:|--:|--:|--:|--:|--:|"]
        for name, row in results["workload1"].items():
            system, load = name.split(" ")
            cpu = row["cpu_us"]["median"]
            times = f"{cpu / nginx:.1f}x" if cpu and nginx else "-"
            out.append(
                f"| {system} | {LOADS[load]} | {_range(row['cpu_us'], ',.0f')}"
                f" | {_range(row.get('store_cpu_us'), ',.0f')} | {times}"
                f" | {_range(row['rps'], ',.0f')} | {_range(row['p50_ms'], '.1f')}"
                f" | {_range(row['p99_ms'], '.1f')} | {_range(row.get('runq_wait'), '.0%')} |"
            )
        for what, ratio, target in ratios(report):
            out.append(f"\n{what}: **{ratio:.3f}x** (target {target})")
    if "workload2" in results:
        requests = report["options"]["incident_requests"]
        out += ["", f"| system | billed generations per business request ({requests})"]
        out[-1] += " | billed | upstream requests | answered | answered p99 s | cores busy"
        out[-1] += " | waited for a core |"
        out += ["|---|--:|--:|--:|--:|--:|--:|--:|"]
        for name, row in results["workload2"].items():
            out.append(
                f"| {name} | {_range(row['billed_per_request'], '.3f')}"
                f" | {_range(row['billed'], '.0f')} | {_range(row['upstream_requests'], '.0f')}"
                f" | {_range(row['answered'], '.0f')} | {_range(row['p99_s'], '.2f')}"
                f" | {_range(row.get('cores_busy'), '.2f')}"
                f" | {_range(row.get('runq_wait'), '.0%')} |"
            )
    if "workload3" in results:
        streams = report["options"]["streams"]
        out += ["", f"| system ({streams} streams) | answered | TTFB p50 ms | TTFB p99 ms"]
        out[-1] += " | added TTFB p99 ms | total p99 ms | added total p99 ms | peak RSS MiB"
        out[-1] += " | CPU ms per stream | waited for a core |"
        out += ["|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for name, row in results["workload3"].items():
            out.append(
                f"| {name} | {_range(row['answered'], '.0f')} | {_range(row['ttfb_p50_ms'], '.1f')}"
                f" | {_range(row['ttfb_p99_ms'], '.1f')}"
                f" | {_range(row.get('added_ttfb_p99_ms'), '.1f')}"
                f" | {_range(row['total_p99_ms'], '.0f')}"
                f" | {_range(row.get('added_total_p99_ms'), '.0f')}"
                f" | {_range(row['rss_peak_mib'], '.0f')}"
                f" | {_range(row.get('cpu_us_per_call'), '.2f', 1e-3)}"
                f" | {_range(row.get('runq_wait'), '.0%')} |"
            )
    if "workload4" in results:
        calls = report["options"]["calls"]
        seconds = report["options"]["call_seconds"]
        out += ["", f"| system ({calls} calls of {seconds} s) | answered | streams: TTFB p99 ms"]
        out[-1] += " | added p50 / p99 ms | whole responses: TTFB p99 ms | added p50 / p99 ms"
        out[-1] += " | RSS idle → peak MiB | KiB per call | peak fds | CPU ms per call"
        out[-1] += " | waited for a core | loop lag p99 ms | collector pause max ms |"
        out += ["|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for name, row in results["workload4"].items():
            cells = [name, f"{_range(row['answered'], '.0f')}/{calls}"]
            for label in ("stream", "whole"):
                cells.append(_range(row.get(f"{label}_ttfb_p99_ms"), ",.0f"))
                cells.append(
                    f"{_range(row.get(f'{label}_added_ttfb_p50_ms'), '+.0f')} /"
                    f" {_range(row.get(f'{label}_added_ttfb_p99_ms'), '+.0f')}"
                )
            cells.append(
                f"{_range(row['rss_before_mib'], '.0f')} → {_range(row['rss_peak_mib'], '.0f')}"
            )
            cells.append(_range(row["rss_per_call_kib"], ".1f"))
            cells.append(_range(row["peak_fds"], ".0f"))
            cpu = _range(row["cpu_us_per_call"], ".2f", 1e-3)
            if row.get("store_cpu_us_per_call"):
                cpu += f" (+{_range(row['store_cpu_us_per_call'], '.2f', 1e-3)} store)"
            cells.append(cpu)
            cells.append(_range(row.get("runq_wait"), ".0%"))
            cells.append(_range(row.get("loop_lag_p99_ms"), ".0f"))
            cells.append(_range(row.get("gc_pause_max_ms"), ".0f"))
            out.append("| " + " | ".join(cells) + " |")
        out += [
            "",
            "added: against calls of the same kinds sent direct to the simulator by the same"
            " load generators in the same run (the direct row: its own noise). Loop lag and"
            " collector pauses: payonce's own histograms (upper bound of the bucket). CPU:"
            " the gateway's process (SQLite's work included), and the store server's"
            " (redis-server, PostgreSQL's backends) apart.",
        ]
    loads = report.get("load_average", {})
    out += ["", "load average (1, 5, 15 min): "]
    out[-1] += "; ".join(f"{when} {values}" for when, values in loads.items())
    return "\n".join(out)


# --------------------------------------------------------------------------- chart

_W, _BAR, _GAP, _LEFT = 760, 18, 6, 250


def _panel(
    title: str, rows: Sequence[tuple[str, dict[str, Any]]], top: float, *, log: bool, unit: str
) -> tuple[list[str], float]:
    """One horizontal bar chart; its SVG elements and its height."""
    parts = [f'<text x="10" y="{top + 16}" font-weight="bold">{escape(title)}</text>']
    values = [row["max"] for _, row in rows if row.get("max")]
    if not values:
        return parts, 30
    high = max(values)
    low = min(row["min"] for _, row in rows if row.get("min")) if log else 0.0
    width = _W - _LEFT - 90
    if log:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        last = max(last, first + 1)

        def x(value: float) -> float:
            return _LEFT + width * (math.log10(value) - first) / (last - first)

        ticks = [10.0**power for power in range(first, last + 1)]
    else:
        step = 0.5 if high <= 4 else 10 ** math.floor(math.log10(high))
        top_value = step * math.ceil(max(1.0, high) * 1.05 / step)

        def x(value: float) -> float:
            return _LEFT + width * value / top_value

        ticks = [step * n for n in range(round(top_value / step) + 1)]
    y = top + 28
    for name, row in rows:
        median = row.get("median")
        parts.append(f'<text x="{_LEFT - 6}" y="{y + 13}" text-anchor="end">{escape(name)}</text>')
        if median:
            start = _LEFT if not log else x(10.0**first)
            parts.append(
                f'<rect x="{start:.1f}" y="{y}" width="{max(1.0, x(median) - start):.1f}"'
                f' height="{_BAR}" fill="{_colour(name)}"/>'
            )
            if row["max"] != row["min"]:
                parts.append(
                    f'<line x1="{x(row["min"]):.1f}" x2="{x(row["max"]):.1f}" y1="{y + 9}"'
                    f' y2="{y + 9}" stroke="#222" stroke-width="1.5"/>'
                )
            label = f"{median:,.0f} {unit}" if median >= 10 else f"{median:.2f}{unit}"
            parts.append(f'<text x="{x(row["max"]) + 6:.1f}" y="{y + 13}">{label}</text>')
        y += _BAR + _GAP
    for tick in ticks:
        parts.append(
            f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{top + 24}" y2="{y}"'
            ' stroke="#bbb" stroke-dasharray="2,3"/>'
        )
        text = f"{tick:g}"
        parts.append(f'<text x="{x(tick):.1f}" y="{y + 14}" text-anchor="middle">{text}</text>')
    return parts, y - top + 30


def _colour(name: str) -> str:
    if name.startswith("payonce"):
        return "#2a7ab9"
    if name.startswith("nginx"):
        return "#4caf50"
    if name.startswith("litellm"):
        return "#d9534f"
    if name.startswith("portkey"):
        return "#f0a030"
    return "#999"


def _chart_name(name: str) -> str:
    system, load = name.split(" ")
    if system == "direct":
        return "the simulator itself (direct)"
    return f"{system} {LOADS[load]}"


def svg(report: dict[str, Any]) -> str:
    """The chart: CPU per request (workload 1) and billed per business request (2)."""
    results = report["results"]
    parts: list[str] = []
    top = 10.0
    cpu = [(_chart_name(name), row["cpu_us"]) for name, row in results.get("workload1", {}).items()]
    if cpu:
        title = "CPU per request, µs (log scale; zero-latency upstream, median of rounds, min-max)"
        panel, height = _panel(title, cpu, top, log=True, unit="µs")
        parts += panel
        top += height + 10
    billed = [
        (name, row["billed_per_request"]) for name, row in results.get("workload2", {}).items()
    ]
    if billed:
        title = "Billed generations per business request (the incident; 1.0 is ideal)"
        panel, height = _panel(title, billed, top, log=False, unit="")
        parts += panel
        top += height + 10
    parts.append(
        f'<text x="10" y="{top + 10}" fill="#555">{escape(report["machine"])};'
        f" {escape(report['date'])}; benchmarks/peers.py</text>"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{top + 24:.0f}"'
        ' font-family="sans-serif" font-size="12">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(parts) + "\n</svg>\n"
    )


def main(argv: Sequence[str]) -> int:
    report = json.loads(Path(argv[0]).read_text())
    print(table(report))
    if len(argv) > 1:
        Path(argv[1]).write_text(svg(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
