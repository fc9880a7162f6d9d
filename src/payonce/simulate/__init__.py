"""Simulate: what a timeout and retry configuration costs, with no network (issue 14).

A vectorised Monte Carlo of a business request going down application loop →
SDK → [retrying proxy] → [payonce] → provider, where every generation that
starts is billed. docs/simulate.md describes the model and its assumptions.

The modules, in the order a run goes through them::

    latency.py, empirical.py   --latency: fixed, lognormal (as payonce sim), empirical files
    config.py                  StackConfig and the parsers of the other flags
    model.py                   simulate(): the Monte Carlo, one array per figure
    closed_form.py             the exact answer for the simple cases
    report.py                  figures, the recommended timeout, the --json document
    terminal.py                the rich table
    sweep.py, chart.py, html.py  the --html page: figures against the client timeout
    cli.py                     the command (NumPy and rich are imported when it runs)

This package imports nothing on import, so ``payonce --help`` works without the
``simulate`` extra. From Python::

    from payonce.simulate.config import ProxyConfig, StackConfig
    from payonce.simulate.latency import parse_distribution
    from payonce.simulate.model import simulate
    from payonce.simulate.report import figures

    stack = StackConfig(parse_distribution("lognormal:p50=4s,p99=30s"), timeout=10.0,
                        app_attempts=2, proxy=ProxyConfig(timeout=8.0, retries=1))
    figures(simulate(stack, 1_000_000, seed=1)).duplicate_ratio   # ~0.3125
"""
