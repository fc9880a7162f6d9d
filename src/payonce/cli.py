"""The ``payonce`` command line: the only module that wires the parts together."""

from __future__ import annotations

import click

from payonce import __version__
from payonce.sim.cli import sim_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="payonce")
def main() -> None:
    """payonce: make a retried LLM API call cost the same as one call."""


main.add_command(sim_command, "sim")
