"""Optuna's own plotly figures for a tuning study, and the per-batch-size schedule chart.

Multi-objective studies (``--objectives throughput,memory``) get the Pareto front; the history and
the parameter importances then follow the first objective (throughput), as Optuna requires a
``target`` for them.
"""
from __future__ import annotations

import warnings
from typing import Any

import plotly.graph_objects as go
from optuna import visualization as vis
from optuna.trial import TrialState

from specdec_tune.dashboard.figure_layout import fit_title


def objective_names(study: Any) -> list[str]:
    """One name per objective: Optuna's metric names, else the ``objectives`` ``tune`` stored with the study."""
    n = len(study.directions)
    attrs = study.user_attrs
    stored = attrs.get("objectives") or (attrs.get("tune") or {}).get("objectives") or []
    names = list(study.metric_names or []) or list(stored)
    return names[:n] if len(names) >= n else [f"objective {i + 1}" for i in range(n)]


def study_figures(study: Any) -> dict[str, go.Figure]:
    """``history``, ``importance`` (when Optuna can compute it) and ``pareto`` (several objectives).

    A study with no completed trial gives ``{}``; importance needs at least two completed trials
    whose parameters vary, and is left out otherwise.
    """
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return {}
    names = objective_names(study)
    multi = len(study.directions) > 1
    target = (lambda t: t.values[0]) if multi else None
    figs: dict[str, go.Figure] = {}
    figs["history"] = vis.plot_optimization_history(study, target=target, target_name=names[0])
    # With an explicit target Optuna's evaluator ranks parameters by how they reach *low* values, so a
    # maximised first objective is negated for the importances (the history keeps its sign).
    maximize = study.directions[0].name == "MAXIMIZE"
    ranked = (lambda t: -t.values[0] if maximize else t.values[0]) if multi else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the "low target values" note: handled above
            figs["importance"] = vis.plot_param_importances(study, target=ranked, target_name=names[0])
    except (ValueError, RuntimeError, ZeroDivisionError):
        pass  # too few trials, or no parameter varies: nothing to rank
    if multi:
        figs["pareto"] = vis.plot_pareto_front(study, target_names=names)
    for fig in figs.values():
        fit_title(fig.update_layout(height=380, margin=dict(l=50, r=20, t=50, b=45)))
    return figs


def schedule_chart(per_batch_size: dict[int, int]) -> go.Figure:
    """Best N per batch size (0 = do not speculate), predicted from T_v(B, k)."""
    bs = sorted(per_batch_size)
    fig = go.Figure(go.Bar(x=[str(b) for b in bs], y=[per_batch_size[b] for b in bs],
                           text=[str(per_batch_size[b]) for b in bs], textposition="outside"))
    fig.update_layout(title="Per-batch-size schedule: best N for each batch size (predicted; 0 = do not speculate)",
                      xaxis_title="batch size B", yaxis_title="N", height=340, margin=dict(l=50, r=20, t=50, b=45),
                      xaxis_type="category")
    return fit_title(fig)
