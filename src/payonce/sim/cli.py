"""``payonce sim``: placeholder, being written."""

from __future__ import annotations

import click


@click.command()
def sim_command() -> None:
    """Run the simulated LLM provider."""
    raise click.ClickException("not written yet")
