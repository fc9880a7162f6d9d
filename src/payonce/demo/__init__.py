"""``payonce demo``: the retry double-billing incident replayed end to end, and payonce removing it.

Real processes on free 127.0.0.1 ports (the simulated provider, a retrying proxy,
the gateway) and the official ``openai`` SDK inside an application loop run the
same business requests through five stacks, with every duration scaled down
(``--time-scale``). The bill is the simulator's ledger; the figures are read
from it and from what the application saw (:mod:`payonce.demo.figures`).
"""
