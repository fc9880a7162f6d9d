"""``payonce lint``: the command line of the linter.

Exit codes: 0 nothing found, 1 findings, 2 a usage or configuration error
(a path that does not exist, an unknown rule code), always with one line on
stderr and no traceback.
"""

from __future__ import annotations

import sys

import click

from payonce.lint.engine import lint_paths
from payonce.lint.report import render, summary
from payonce.lint.rules import RULES, RuleSelection

__all__ = ["lint_command"]


def _rule_table() -> str:
    return "\n".join(f"  {rule.code}  {rule.summary}" for rule in RULES.values())


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="\b\nRules (docs/lint-rules.md):\n" + _rule_table(),
)
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json", "sarif"]),
    default="text",
    show_default=True,
    help="text: path:line:col: CODE message; sarif: SARIF 2.1.0 for GitHub code scanning.",
)
@click.option(
    "--select",
    multiple=True,
    metavar="CODES",
    help="Only these codes or prefixes, comma-separated (PO1,PO201). Repeatable.",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="CODES",
    help="Leave out these codes or prefixes, comma-separated. Repeatable.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the report to this file instead of stdout.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes for large trees (default: one per CPU).",
)
@click.option("--quiet", "-q", is_flag=True, help="No summary line on stderr.")
def lint_command(
    paths: tuple[str, ...],
    output_format: str,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    output: str | None,
    jobs: int | None,
    quiet: bool,
) -> None:
    """Find stacked retries and unkeyed retried LLM calls in code and proxy configs.

    Reads Python files (with ast; nothing is imported or run), nginx
    configurations (*.conf) and Envoy/LiteLLM YAML files under each PATH.
    Suppress a finding with a "# noqa: PO201" comment on its line.
    """
    selection = RuleSelection.build(select, ignore)
    result = lint_paths(paths, selection, jobs=jobs)
    report = render(result, output_format)
    if output is not None:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(report + "\n")
    elif report:
        click.echo(report)
    if not quiet:
        click.echo(summary(result), err=True)
    if result.findings:
        sys.exit(1)
