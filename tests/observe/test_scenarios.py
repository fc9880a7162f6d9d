"""Endpoints and scenarios: classification, header reading and bounded metric labels."""

from __future__ import annotations

import pytest

from payonce.clock import SystemClock
from payonce.config import GatewaySettings
from payonce.errors import ConfigError
from payonce.gateway.observing import Observer
from payonce.observe.metrics import Metrics
from payonce.observe.scenarios import Scenarios, endpoint_of


@pytest.mark.parametrize(
    ("path", "endpoint"),
    [
        ("/v1/chat/completions", "chat"),
        ("/openai/deployments/gpt/chat/completions", "chat"),
        ("/v1/responses", "responses"),
        ("/v1/responses/resp_123", "responses"),
        ("/v1/messages", "messages"),
        ("/v1/completions", "completions"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/models", "other"),
        ("/model/anthropic.claude/invoke", "other"),
        # The gateway's own paths call no provider API (a fetched answer's line).
        ("/_payonce/requests/order-1/response", None),
        ("/_payonce/requests/x/chat/completions", None),
    ],
)
def test_each_path_is_classified_by_the_api_it_calls(path: str, endpoint: str | None) -> None:
    assert endpoint_of(path) == endpoint


def test_the_payonce_header_wins_over_the_ones_a_team_already_sends() -> None:
    scenarios = Scenarios(["Helicone-Property-Feature", "x-litellm-tags"], ["invoice"])
    both = [(b"x-litellm-tags", b"tag-a,tag-b"), (b"x-payonce-scenario", b"invoice")]
    assert scenarios.of(both) == "invoice"
    assert scenarios.of([(b"x-litellm-tags", b"tag-a,tag-b")]) == "tag-a,tag-b"
    assert scenarios.of([(b"x-other", b"x")]) is None
    assert scenarios.label("invoice") == "invoice"
    assert scenarios.label("tag-a,tag-b") == "other"
    assert scenarios.label(None) == "none"


def test_a_thousand_made_up_scenario_names_add_no_series() -> None:
    scenarios = Scenarios((), ["invoice-summary"])
    metrics = Metrics(scenarios=scenarios)
    observer = Observer(metrics, None, SystemClock(), None, scenarios)

    def series() -> set[str]:
        return {
            line.split(" ")[0]
            for line in metrics.render().decode().splitlines()
            if line.startswith("payonce_scenario_")
        }

    before = series()
    for index in range(1000):
        headers = [(b"x-payonce-scenario", f"made-up-{index}".encode())]
        record = observer.start("POST", "/v1/chat/completions", "t", headers)
        assert record.scenario == f"made-up-{index}"
        record.outcome, record.status, record.cost_usd = "forwarded", 200, 0.001
        observer.finish(record)
    after = series()
    assert after == before
    other = 'payonce_scenario_requests_total{endpoint="chat",scenario="other"} 1000.0'
    assert other in metrics.render().decode()


def test_a_fetched_answer_is_counted_under_endpoint_other_with_its_scenario() -> None:
    """A request to /_payonce/ names no endpoint (null in the call log); its metrics
    series is endpoint "other", its scenario kept (no new series)."""
    scenarios = Scenarios((), ["invoice-summary"])
    metrics = Metrics(scenarios=scenarios)
    observer = Observer(metrics, None, SystemClock(), None, scenarios)
    headers = [(b"x-payonce-scenario", b"invoice-summary")]
    record = observer.start("GET", "/_payonce/requests/order-1/response", "t", headers)
    assert record.endpoint is None
    record.outcome, record.status = "replayed", 200
    observer.finish(record)
    text = metrics.render().decode()
    series = (
        'payonce_scenario_duplicates_prevented_total{endpoint="other",scenario="invoice-summary"}'
    )
    assert f"{series} 1.0" in text
    assert 'endpoint="None"' not in text


def test_scenario_settings_are_checked() -> None:
    settings = GatewaySettings(scenario_header=("Helicone-Property-Feature, x-litellm-tags",))
    assert settings.scenario_header == ("helicone-property-feature", "x-litellm-tags")
    assert GatewaySettings(scenarios=("a,b", "c")).scenarios == ("a", "b", "c")
    assert GatewaySettings(scenarios="a, b").scenarios == ("a", "b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--scenarios"):
        GatewaySettings(scenarios=tuple(f"s{i}" for i in range(101)))
    with pytest.raises(ConfigError, match="--scenario-header"):
        GatewaySettings(scenario_header=("bad header:",))


def test_a_credential_can_have_a_scenario_of_its_own() -> None:
    settings = GatewaySettings(credential_scenario=("t-batch=nightly-batch", "t-bot=support-bot"))
    assert settings.credential_scenario == {"t-batch": "nightly-batch", "t-bot": "support-bot"}
    assert GatewaySettings(credential_scenario={"t": "x"}).credential_scenario == {"t": "x"}  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--credential-scenario"):
        GatewaySettings(credential_scenario=("no-equals-sign",))
    scenarios = Scenarios((), ["nightly-batch"], settings.credential_scenario)  # type: ignore[arg-type]
    observer = Observer(None, None, SystemClock(), None, scenarios)
    quiet = observer.start("POST", "/v1/chat/completions", "t-batch", [])
    assert (quiet.scenario, quiet.scenario_label) == ("nightly-batch", "nightly-batch")
    # A scenario the request names wins over its credential's.
    named = observer.start(
        "POST", "/v1/chat/completions", "t-batch", [(b"x-payonce-scenario", b"invoice")]
    )
    assert (named.scenario, named.scenario_label) == ("invoice", "other")
    other = observer.start("POST", "/v1/chat/completions", "t-else", [])
    assert (other.scenario, other.scenario_label) == (None, "none")
