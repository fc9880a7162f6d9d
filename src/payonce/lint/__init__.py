"""``payonce lint``: stacked retries and unkeyed retried LLM calls, found before the bill.

The incident report's checklist made executable: every retried LLM call carries
an idempotency key, only one layer retries, and timeouts give generations the
time they take. Rules are listed in :data:`RULES` and ``docs/lint-rules.md``.

Layout: ``engine`` finds files and runs the rules; ``analyzer`` walks Python
modules (with ``names``, ``sdk``, ``calls``, ``retries``, ``timeouts``) and
``verdicts`` judges each LLM call;
``config_files`` holds the nginx/Envoy/LiteLLM rules (with ``nginx`` and
``yaml_subset``); ``report`` writes text, JSON and SARIF; ``cli`` is the command.
"""

from payonce.lint.engine import LintResult, lint_file, lint_paths
from payonce.lint.findings import Finding
from payonce.lint.rules import RULES, Rule, RuleSelection

__all__ = ["RULES", "Finding", "LintResult", "Rule", "RuleSelection", "lint_file", "lint_paths"]
