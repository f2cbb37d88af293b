"""Placers, ``Problem -> Schedule``: DPOS, the baselines (single device, data parallelism,
HEFT, Baechi's m-TOPO/m-ETF/m-SCT), PipeDream (``pipedream`` over the ``stages``
partitioner), the exact MILP, and the order of a step's first transfers (``transfer_order``)."""
