"""The Grafana dashboard and the Prometheus rules query only what the gateway exports.

Every ``payonce_*`` name in every PromQL expression of ``deploy/grafana/payonce.json``
(panels and template variables) and ``deploy/prometheus-rules.yml`` must be a metric
of :class:`payonce.observe.metrics.Metrics`, with the suffix its type has on the wire
(``_total`` for counters, ``_bucket/_sum/_count`` for histograms, none for gauges),
and every label an expression selects or groups by must be one of those metrics'
labels. When ``promtool`` is installed, the rules, the scrape config and every
dashboard expression are also parsed by Prometheus itself, and the rules' unit
tests (``deploy/prometheus-rules.test.yml``) run.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from payonce.observe.metrics import Metrics
from tests.support.apt import installed

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "payonce.json"
RULES = ROOT / "deploy" / "prometheus-rules.yml"
RULES_TESTS = ROOT / "deploy" / "prometheus-rules.test.yml"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus.yml"

DATASOURCE_VARIABLE = "datasource"
DATASOURCE_UID = "${" + DATASOURCE_VARIABLE + "}"

_NAME = re.compile(r"\bpayonce_[a-z_]+\b")
_SUFFIX = re.compile(r"_(total|bucket|sum|count)$")
_SELECTOR = re.compile(r"\b(payonce_[a-z_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*(payonce_[a-z_]+)\s*(?:\{[^}]*\})?\s*,\s*(\w+)\s*\)")
# Labels Prometheus adds or that a histogram's buckets carry.
_IMPLICIT_LABELS = {"job", "instance", "le"}
_WIRE_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
}


def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """Base metric name -> (type, label names), as the gateway's registry holds them."""
    registry = Metrics().registry
    families = {family.name: family.type for family in registry.collect()}
    labels: dict[str, frozenset[str]] = {}
    # Label names of a family without children are only on the collector itself.
    for collector in getattr(registry, "_collector_to_names", {}):
        name = getattr(collector, "_name", None)
        names = getattr(collector, "_labelnames", None)
        if isinstance(name, str) and names is not None:
            labels[name] = frozenset(names)
    return {name: (kind, labels.get(name, frozenset())) for name, kind in families.items()}


def base_name(identifier: str) -> str:
    return _SUFFIX.sub("", identifier)


def load_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Panels in order, including those inside collapsed rows."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in all_panels(dashboard["panels"]) if panel.get("type") != "row"]


def variable_query(variable: dict[str, Any]) -> str:
    query = variable.get("query", "")
    return str(query.get("query", "")) if isinstance(query, dict) else str(query)


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    exprs = [
        (f"panel {panel['title']!r} target {target.get('refId')}", target["expr"])
        for panel in query_panels(dashboard)
        for target in panel["targets"]
    ]
    exprs += [
        (f"variable ${variable['name']}", variable_query(variable))
        for variable in dashboard.get("templating", {}).get("list", [])
        if variable.get("type") == "query"
    ]
    return exprs


def rule_exprs(text: str) -> list[tuple[str, str]]:
    """(rule name, PromQL) for each rule of a rules file.

    A small reader for the layout of ``deploy/prometheus-rules.yml`` (``expr:`` inline
    or as a ``|``/``>`` block), so the test needs no YAML library; the test below
    checks it found one expression per rule.
    """
    exprs: list[tuple[str, str]] = []
    name = "?"
    lines = text.splitlines()
    for index, line in enumerate(lines):
        rule = re.match(r"\s*-\s*(?:alert|record):\s*(\S+)", line)
        if rule:
            name = rule.group(1)
        match = re.match(r"(\s*)expr:\s*(.*)$", line)
        if not match:
            continue
        indent, value = len(match.group(1)), match.group(2).strip()
        if value[:1] in ("|", ">"):
            block = []
            for following in lines[index + 1 :]:
                if following.strip() and len(following) - len(following.lstrip()) <= indent:
                    break
                block.append(following.strip())
            value = "\n".join(block).strip()
        elif value[:1] in ("'", '"') and value[-1:] == value[:1]:
            value = value[1:-1]
        exprs.append((name, value))
    return exprs


def all_exprs() -> list[tuple[str, str]]:
    rules = [(f"rule {name}", expr) for name, expr in rule_exprs(RULES.read_text())]
    return dashboard_exprs(load_dashboard()) + rules


def problems_with(expr: str, metrics: dict[str, tuple[str, frozenset[str]]]) -> list[str]:
    """What in one expression the gateway does not export (an empty list when all is)."""
    problems = []
    used = set(_NAME.findall(expr))
    if not used:
        problems.append("queries no payonce_ metric")
    for identifier in sorted(used):
        base = base_name(identifier)
        if base not in metrics:
            problems.append(f"{identifier}: {base} is not exported")
            continue
        kind = metrics[base][0]
        wire = {base + suffix for suffix in _WIRE_SUFFIXES.get(kind, ("",))}
        if identifier not in wire:
            problems.append(f"{identifier}: a {kind} is queried as {' or '.join(sorted(wire))}")
    known = set(_IMPLICIT_LABELS)
    for identifier in used:
        known |= metrics.get(base_name(identifier), ("", frozenset()))[1]
    for metric, matchers in _SELECTOR.findall(expr):
        own = metrics.get(base_name(metric), ("", frozenset()))[1] | _IMPLICIT_LABELS
        problems += [
            f"{metric} has no label {label!r}"
            for label in _MATCHER.findall(matchers)
            if label not in own and label != "__name__"
        ]
    for group in _GROUPING.findall(expr):
        labels = [label.strip() for label in group.split(",") if label.strip()]
        problems += [
            f"no metric here has a label {label!r}" for label in labels if label not in known
        ]
    for metric, label in _LABEL_VALUES.findall(expr):
        if label not in metrics.get(base_name(metric), ("", frozenset()))[1]:
            problems.append(f"{metric} has no label {label!r}")
    return problems


# ---------------------------------------------------------------- the registry itself


def test_registry_names_and_labels_are_readable() -> None:
    metrics = exported()
    assert metrics["payonce_requests"] == ("counter", frozenset({"outcome", "status_class"}))
    assert metrics["payonce_upstream_latency_seconds"][0] == "histogram"
    assert metrics["payonce_in_flight_requests"][0] == "gauge"
    assert metrics["payonce_cost_usd"][1] == {"model"}


# ---------------------------------------------------------------- the dashboard


def test_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = load_dashboard()
    assert dashboard["title"]
    assert dashboard["uid"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert isinstance(dashboard["panels"], list)
    panels = query_panels(dashboard)
    assert len(panels) >= 15
    for panel in all_panels(dashboard["panels"]):
        assert panel.get("title"), panel
        assert panel.get("type"), panel
        assert {"h", "w", "x", "y"} <= set(panel.get("gridPos", {})), panel["title"]
    for panel in panels:
        assert panel.get("description"), f"{panel['title']!r} has no description"
        targets = panel.get("targets")
        assert targets, f"{panel['title']!r} has no targets"
        for target in targets:
            assert target.get("expr", "").strip(), f"{panel['title']!r}: a target has no expr"
            assert target.get("refId"), f"{panel['title']!r}: a target has no refId"
        ref_ids = [target["refId"] for target in targets]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]
    ids = [panel["id"] for panel in all_panels(dashboard["panels"])]
    assert len(set(ids)) == len(ids), "panel ids repeat"


def test_dashboard_panels_use_the_datasource_variable() -> None:
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    variable = variables[DATASOURCE_VARIABLE]
    assert variable["type"] == "datasource"
    assert variable["query"] == "prometheus"
    assert "__inputs" not in dashboard, "a datasource variable needs no import inputs"
    for panel in query_panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, panel["title"]
        for target in panel["targets"]:
            if "datasource" in target:
                assert target["datasource"]["uid"] == DATASOURCE_UID, panel["title"]
    for other in variables.values():
        if other["type"] == "query":
            assert other["datasource"]["uid"] == DATASOURCE_UID, other["name"]
    # No panel names a concrete datasource anywhere (a uid from someone's Grafana).
    text = DASHBOARD.read_text()
    assert set(re.findall(r'"uid":\s*"([^"]*)"', text)) <= {
        DATASOURCE_UID,
        "-- Grafana --",
        dashboard["uid"],
    }


def test_dashboard_units() -> None:
    units = {
        panel["title"]: panel["fieldConfig"]["defaults"].get("unit")
        for panel in query_panels(load_dashboard())
    }
    assert units["Spend by model (USD per hour)"] == "currencyUSD"
    assert units["Cost per successful call"] == "currencyUSD"
    assert units["Duplicate ratio"] == "percentunit"
    assert units["Idempotency hit rate"] == "percentunit"
    assert units["Upstream latency p50 / p99"] == "s"
    assert units["Gateway overhead p50 / p99"] == "s"


# ---------------------------------------------------------------- names and labels


def test_rules_file_is_read_whole() -> None:
    text = RULES.read_text()
    rules = re.findall(r"^\s*-\s*(?:alert|record):", text, re.MULTILINE)
    exprs = rule_exprs(text)
    assert len(rules) >= 4
    assert len(exprs) == len(rules)
    assert all(expr for _, expr in exprs)
    names = {name for name, _ in exprs}
    assert {"PayonceDuplicateRatioRising", "PayonceStoreErrors"} <= names


@pytest.mark.parametrize(("where", "expr"), all_exprs(), ids=lambda value: str(value)[:60])
def test_expression_queries_only_exported_metrics(where: str, expr: str) -> None:
    problems = problems_with(expr, exported())
    assert not problems, f"{where}: {problems}\n{expr}"


def test_every_exported_metric_is_on_the_dashboard() -> None:
    used = {
        base_name(name)
        for _, expr in dashboard_exprs(load_dashboard())
        for name in _NAME.findall(expr)
    }
    assert set(exported()) - used == set()


def test_the_check_catches_a_name_the_gateway_does_not_export() -> None:
    metrics = exported()
    assert problems_with("sum(rate(payonce_cost_usd_total[5m]))", metrics) == []
    assert problems_with("sum(rate(payonce_costs_usd_total[5m]))", metrics)
    assert problems_with("sum(rate(payonce_cost_usd[5m]))", metrics)  # a counter without _total
    assert problems_with("payonce_in_flight_requests_total", metrics)  # a gauge with one
    assert problems_with('sum(rate(payonce_upstream_calls_total{status_class="5xx"}[5m]))', metrics)
    assert problems_with("sum by (model) (rate(payonce_requests_total[5m]))", metrics)
    assert problems_with("label_values(payonce_cost_usd_total, tenant)", metrics)
    broken = [
        (
            where,
            expr.replace("payonce_unprotected_retries_total", "payonce_unprotected_retry_total"),
        )
        for where, expr in all_exprs()
    ]
    assert any(problems_with(expr, metrics) for _, expr in broken)


# ---------------------------------------------------------------- Prometheus's own checks


def run_promtool(*args: str | Path) -> None:
    # Debian's prometheus package carries promtool (installed on first use, as root).
    promtool = installed(["promtool"], "prometheus", required=False)
    result = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_scrape_config_and_rules() -> None:
    run_promtool("check", "config", SCRAPE_CONFIG)
    run_promtool("check", "rules", RULES)


def test_rules_fire_when_the_numbers_move() -> None:
    run_promtool("test", "rules", RULES_TESTS)


def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    # Grafana's variables replaced as Grafana would; written as recording rules (JSON is YAML).
    substitutions = {"$__rate_interval": "1m", "$__range": "1d", "$model": ".*"}
    rules = []
    for index, (_, expr) in enumerate(dashboard_exprs(load_dashboard())):
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        # A variable's label_values(selector, label) is Grafana's; Prometheus parses the selector.
        expr = re.sub(r"^label_values\((.*),\s*\w+\s*\)$", r"\1", expr.strip())
        assert "$" not in expr, expr
        rules.append({"record": f"payonce:dashboard_check_{index}", "expr": expr})
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool("check", "rules", path)
