"""Runs a recipe in a framework's own virtualenv: ``python driver.py RECIPE.py TICKET...``.

The recipe defines ``handle(ticket)``, one business request; the driver calls it
once per ticket given (the same ticket twice: the application re-ran the
request, as a job queue or a user's second click does) and prints one JSON line
per call: its answer, or the error it raised. It imports nothing from payonce
or the tests: it runs where only the framework is installed.
"""

import json
import sys

namespace: dict = {"__name__": "recipe"}
with open(sys.argv[1]) as source:
    exec(compile(source.read(), sys.argv[1], "exec"), namespace)
for ticket in sys.argv[2:]:
    try:
        outcome = {"answer": str(namespace["handle"](ticket))}
    except Exception as exc:
        outcome = {
            "error": type(exc).__name__,
            "message": str(exc)[:20000],
            "attempts": getattr(exc, "n_attempts", None),  # instructor's
        }
    print(json.dumps(outcome), flush=True)
