"""Predict, search, export and guard speculative-decoding configurations, in four rooms.

- :mod:`specdec_tune.tuner.model`: the pure throughput model; predicts any configuration from a stored profile.
- :mod:`specdec_tune.tuner.servers`: what each server can express, its calibrated time model, the files it reads.
- :mod:`specdec_tune.tuner.search`: the Optuna search and the jobs that confirm it by measurement (tune, validate).
- :mod:`specdec_tune.tuner.regress`: nightly regression: suites, statistics, comparisons, drift, reports.

Each room imports only the rooms listed above it and only their public names (``docs/architecture.md``).
"""
