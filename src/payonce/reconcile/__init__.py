"""Reconcile: join call logs with a provider's bill by request id.

How many billed generations were duplicates of a business request already billed,
what they cost, what one successful business call really costs, and which spend
nothing explains (docs/reconcile.md has the definitions).

The modules, in the order data flows through them::

    sniff.py     what each file is (CSV, JSON lines, JSON; which format)
    schema.py    the normalized fields, the formats, --calls-map/--bill-map
    loading.py   files -> DuckDB tables calls, bill, malformed
    analysis.py  the join and every figure
    report.py    the figures as frozen values and their JSON
    terminal.py, html.py, charts.py, alerts.py   the outputs
    exports.py   providers' usage and cost report pages -> tables usage, costs
    keymap.py    --key-map: tenant ids to provider API keys or projects
    usage_sql.py, usage_analysis.py   the bucket-by-bucket comparison
    usage_report.py, usage_views.py   its figures, terminal summary and HTML
    fetch.py     --fetch: the reports pulled from the providers' admin APIs
    run.py       reconcile(): files to a Report (or a UsageReport)
    cli.py, main.py  the command (DuckDB and rich are imported only when it runs)

This package imports nothing heavy on import: ``payonce --help`` must work without
the ``reconcile`` extra. Use :func:`payonce.reconcile.run.reconcile` from Python.
"""
