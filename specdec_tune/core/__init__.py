"""The core: the rules and records every room shares (docs/architecture.md, Rooms).

Pure Python; it imports no room (an import-linter contract keeps that). Each module is one concept:
``errors`` (the exception hierarchy), ``limits`` (the engine's limits), ``speculative`` (the speculative
configuration: one record every room holds), ``stats`` (trimmed means and
bootstrap CIs), ``schedules`` (speculative-length schedules and threshold rules), ``splits`` (the tuning /
held-out prompt split), ``consistency`` (when two greedy outputs count as consistent in each dtype),
``trees`` (token-tree shapes and Sequoia's dynamic program), ``jsonsafe`` (JSON without NaN or infinity),
``latency`` (TTFT, TPOT, inter-token gaps, SLOs and goodput), ``costs`` (dollars per million tokens),
``cache`` (specdec-tune's cache folder) and ``testpoints`` (named pause points for the tests).
"""
