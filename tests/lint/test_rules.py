"""Every rule against its fixtures: exactly the annotated findings, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from payonce.lint import lint_file
from payonce.lint.engine import FileKind, kind_of
from tests.lint.conftest import FIXTURES, expected_findings

ANNOTATED = sorted(
    path
    for path in [*FIXTURES.glob("python/*.py"), *FIXTURES.glob("configs/*")]
    if not path.name.startswith("broken_")
)


@pytest.mark.parametrize("path", ANNOTATED, ids=lambda path: path.name)
def test_fixture_findings_match_their_annotations(path: Path) -> None:
    kind = kind_of(path)
    assert kind is not None
    found = {(finding.line, finding.code) for finding in lint_file(str(path), kind)}
    assert found == expected_findings(path)


def test_every_rule_has_a_positive_fixture() -> None:
    from payonce.lint import RULES

    annotated = {code for path in ANNOTATED for _, code in expected_findings(path)}
    assert annotated | {"PO901", "PO902"} == set(RULES)


def messages(path: Path, code: str) -> list[str]:
    kind = kind_of(path)
    assert kind is not None
    return [
        f"{finding.line}: {finding.message}"
        for finding in lint_file(str(path), kind)
        if finding.code == code
    ]


def test_stack_arithmetic_uses_the_literals() -> None:
    found = messages(FIXTURES / "python/stacked_sdk_retries.py", "PO101")
    by_line = {int(text.split(":")[0]): text for text in found}
    assert "3 x 5 = 15 billed calls" in by_line[23]  # default max_retries=2, stop_after_attempt(5)
    assert "5 x 3 = 15" in by_line[33]  # max_retries=4, stop_after_attempt(3) | stop_after_delay
    assert "3 x 4 = 12" in by_line[38]  # backoff max_tries=4
    assert "3 x 10 = 30" in by_line[43]  # stamina's default attempts
    assert "3 x 3 = 9" in by_line[49]  # for attempt in range(3)
    assert "6 x ? = at least 6 (some factors unknown)" in by_line[82]  # while True
    assert "3 x 6 = 18" in by_line[91]  # Celery max_retries=5
    assert "tenacity @retry on line 98" in by_line[95]  # through calls_helper()


def test_aliases_resolve() -> None:
    found = messages(FIXTURES / "python/stacked_sdk_retries.py", "PO101")
    assert any("OpenAI SDK client `oa.OpenAI`" in text for text in found)  # import openai as oa
    assert any("`client`, line 16" in text for text in found)  # from openai import OpenAI as C
    assert any("`self.client`, line 77 (max_retries=5)" in text for text in found)
    assert any("`openai (module)`" in text for text in found)


def test_sdk_key_does_not_survive_application_retries() -> None:
    (text,) = messages(FIXTURES / "python/keys.py", "PO201")[1:2]
    assert "minted per SDK call, so it is new on every application attempt" in text


def test_litellm_unknown_factor_is_said_honestly() -> None:
    (text,) = messages(FIXTURES / "python/keys.py", "PO101")[1:]
    assert "max_retries not set: provider SDK retries unknown" in text
    assert "at least 6" in text


def test_a_key_on_one_branch_names_the_path_without_it() -> None:
    path = FIXTURES / "python/key_paths.py"
    (one_branch, built_last, elif_chain, inline) = messages(path, "PO201")
    assert "on the path where `use_key` is false" in one_branch
    assert "on the path where `use_key` is false" in built_last  # if not use_key: headers = {}
    assert "`tier == 'gold'` is false and `tier == 'silver'` is false" in elif_chain
    assert "on the path where `use_key` is false" in inline
    (sdk,) = messages(path, "PO202")
    assert "on the path where `use_key` is false" in sdk
    assert all("on the path where" in text for text in messages(path, "PO401"))


def test_an_annotated_parameter_is_a_client_built_elsewhere() -> None:
    path = FIXTURES / "python/annotated_clients.py"
    (first, *_) = messages(path, "PO101")
    assert (
        "parameter `client: openai.OpenAI`, constructed elsewhere:"
        " assumed the SDK default max_retries=2" in first
    )
    assert "3 x 3 = 9 billed calls" in first
    assert "with_options(max_retries=0)" in first  # the fix works without the constructor
    texts = messages(path, "PO202")
    assert any("parameter `client: AsyncAnthropic | None`" in text for text in texts)
    assert any("parameter `client: 'Optional[anthropic.AsyncAnthropic]'`" in text for text in texts)
    assert any("Anthropic SDK client `client`" in text for text in texts)


def test_the_demo_shape_reports_run_a() -> None:
    path = FIXTURES / "python/demo_ask.py"
    (po101, *_) = messages(path, "PO101")
    assert "parameter `client: openai.AsyncOpenAI`, constructed elsewhere" in po101
    assert "3 x 2 = 6 billed calls" in po101
    (po201,) = messages(path, "PO201")
    assert "on the path where `use_key` is false" in po201
    (po401,) = messages(path, "PO401")
    assert "on the path where `use_key` is false" in po401


def test_proxy_stacks() -> None:
    (first, second) = messages(FIXTURES / "configs/envoy.yaml", "PO502")
    assert "up to 4 billed calls per request, 12 with the callers' default SDK retries" in first
    assert "per_try_timeout 10s" in first
    assert "up to 2 billed calls" in second  # Envoy's default num_retries is 1
    nginx = messages(FIXTURES / "configs/nginx_llm.conf", "PO501")
    assert any("up to 3 billed calls per request" in text for text in nginx)


@pytest.mark.parametrize(
    ("name", "line", "needle"),
    [
        ("broken_envoy.yaml", 4, "unexpected indentation"),
        ("broken_nginx.conf", 4, "has no ';'"),
    ],
)
def test_unparsable_configs_are_po902(name: str, line: int, needle: str) -> None:
    path = FIXTURES / "configs" / name
    kind = kind_of(path)
    assert kind is not None
    (finding,) = lint_file(str(path), kind)
    assert (finding.code, finding.line) == ("PO902", line)
    assert needle in finding.message


def test_unparsable_python_is_po901(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text((FIXTURES / "syntax_error.py.txt").read_text())
    (finding,) = lint_file(str(path), FileKind.PYTHON)
    assert (finding.code, finding.line) == ("PO901", 3)
    assert "syntax error" in finding.message


def test_null_bytes_are_po901_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "nul.py"
    path.write_bytes(b"import openai\x00\n")
    (finding,) = lint_file(str(path), FileKind.PYTHON)
    assert finding.code == "PO901"


def test_coding_cookie_is_honoured(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    source = "# -*- coding: latin-1 -*-\nfrom openai import OpenAI\nname = 'caf\xe9'\n"
    source += "OpenAI(timeout=5, max_retries=0)\n"
    path.write_bytes(source.encode("latin-1"))
    assert [finding.code for finding in lint_file(str(path), FileKind.PYTHON)] == ["PO301"]


def test_modules_without_llm_calls_are_only_parsed(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text(
        "import time\n"
        "def f(client):\n"
        "    for _ in range(3):\n"
        "        try:\n"
        "            return client.chat.completions.create()\n"
        "        except TimeoutError:\n"
        "            continue\n"
    )
    assert lint_file(str(path), FileKind.PYTHON) == []
    path.write_text("import openai\n" + path.read_text())
    codes = sorted(finding.code for finding in lint_file(str(path), FileKind.PYTHON))
    assert codes == ["PO201", "PO401"]  # an unknown client: no SDK factor claimed


def test_an_internal_error_is_a_finding_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from payonce.lint import engine

    def broken(tree: object, path: str) -> list[object]:
        raise KeyError("boom")

    monkeypatch.setattr(engine, "analyze_module", broken)
    path = tmp_path / "app.py"
    path.write_text("import openai\n")
    (finding,) = lint_file(str(path), FileKind.PYTHON)
    assert finding.code == "PO901" and "internal error" in finding.message


def test_litellm_default_retries_name_the_deployments_that_get_them() -> None:
    path = FIXTURES / "configs/litellm_defaults.yaml"
    by_line = {int(text.split(":")[0]): text for text in messages(path, "PO503")}
    default = by_line[3]
    # gpt-4o-mini and o3 set their own (an environment reference counts: it is set).
    assert "num_retries is set nowhere for gpt-4o (" in default
    assert "retries each failed call 2 times by default: 3 x 3" in default
    assert "router_settings: num_retries: 0" in default
    assert "router_settings.retry_policy.TimeoutErrorRetries: 2" in by_line[17]
    assert "whatever num_retries says" in by_line[17]
    assert "model_group_retry_policy.gpt-4o-mini.DefaultRetries: 1" in by_line[22]


def test_litellm_proxy_wide_num_retries_silences_the_default() -> None:
    # litellm_clean.yml sets litellm_settings.num_retries: 0 and nothing per deployment.
    assert messages(FIXTURES / "configs/litellm_clean.yml", "PO503") == []
    (text,) = [
        t
        for t in messages(FIXTURES / "configs/litellm_config.yaml", "PO503")
        if "router_settings" in t
    ]
    assert "3 x 1 (proxy SDK) x 3 (callers' default max_retries=2) = 9 billed calls" in text


def test_a_copied_client_has_lost_its_key() -> None:
    (copied, inline) = messages(FIXTURES / "python/copied_clients.py", "PO202")
    assert "dropped by with_options()/copy() on line 21" in copied
    assert "dropped by with_options()/copy() on line 26" in inline
    assert "up to 6 times" in inline  # copy(max_retries=5)
    assert "`payonce run`" in copied and "protect()" in copied


def test_langchain_advice_points_at_the_sdk_client() -> None:
    (text,) = messages(FIXTURES / "python/langchain_keys.py", "PO202")
    assert "`llm._idempotency_header` on line 10 sets an attribute" in text
    assert '`llm.root_client._idempotency_header = "Idempotency-Key"`' in text
    assert "http_client=" in text


def test_litellm_own_retries_are_counted() -> None:
    (own, sdk) = messages(FIXTURES / "python/litellm_retries.py", "PO202")
    assert "num_retries=4" in own and "up to at least 5 times" in own
    assert "max_retries=2" in sdk and "up to 3 times" in sdk


def test_agents_runner_retries_are_counted() -> None:
    (first, second, third) = messages(FIXTURES / "python/agents_retry.py", "PO201")
    assert "(5 attempts)" in first and "with_options(max_retries=0)" in first
    assert "(3 attempts)" in second
    assert "(2 attempts)" in third


def test_a_retry_by_recursion_is_one_layer() -> None:
    (method, function) = messages(FIXTURES / "python/recursive_retry.py", "PO201")
    assert "recursive call from an except handler on line 13" in method
    assert "recursive call from an except handler on line 28" in function


def test_a_spread_built_here_is_read() -> None:
    (text,) = messages(FIXTURES / "python/kwargs_headers.py", "PO201")
    assert text.startswith("17: litellm.completion()")
    assert "while-loop retry on line 21" in text
