"""``python -m payonce`` runs the CLI."""

from payonce.cli import main

main()
