"""Searches over plans: the starting graphs (``starts``), what the strategies of one graph
share (``planning``), OS-DPOS's split search (``osdpos``), the lower bound that ends a search
early (``bounds``) and whether data parallelism fits memory (``memory_fit``)."""
