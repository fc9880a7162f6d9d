"""``payonce torture``: a seeded, randomized fault checker over real processes.

:mod:`~payonce.torture.plan` draws a schedule of calls and faults from a seed;
:mod:`~payonce.torture.cluster` starts the simulator, gateways and store;
:mod:`~payonce.torture.driver` sends the calls over plain sockets and records what
each client saw; :mod:`~payonce.torture.nemesis` plays the faults;
:mod:`~payonce.torture.checks` holds the invariants of docs/guarantees.md;
:mod:`~payonce.torture.runner` runs a plan and shrinks a failing one.
"""
