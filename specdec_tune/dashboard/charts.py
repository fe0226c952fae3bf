"""Plotly figures built from the loaders' plain data (no database, no Streamlit: tested directly).

Axis titles say what is measured and what is predicted; every rate chart says whether it shows the
conditional α_i or the per-cycle β_i (docs/architecture.md, Words).
"""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from specdec_tune.dashboard.figure_layout import fit_title
from specdec_tune.dashboard.measured import HELD_OUT, FidelityInfo, short_name
from specdec_tune.db import BiasFrontRow
from specdec_tune.dashboard.profile_info import AcceptancePanel, ProfileInfo
from specdec_tune.dashboard.trends import TrendPoint
from specdec_tune.dashboard.why import CycleBudget, HeatMap

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_LAYOUT = dict(margin=dict(l=50, r=20, t=50, b=45), height=360, legend=dict(orientation="h", y=-0.22))


def _fig(title: str, x: str, y: str, **layout: object) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, **{**_LAYOUT, **layout})
    return fit_title(fig)  # wrapped, below the toolbar, the margin sized to it


def _errors(points: Sequence[tuple[float, float, float]]) -> dict:
    """Asymmetric error bars from (centre, low, high) triples."""
    return dict(type="data", symmetric=False, array=[h - c for c, _, h in points],
                arrayminus=[c - lo for c, lo, _ in points])


def verify_chart(info: ProfileInfo) -> go.Figure:
    """T_v(B, k): median per k with the 10th-90th percentile spread, one line per batch size (measured)."""
    fig = _fig("T_v(k): one target forward over k new tokens (measured)", "k (new tokens per forward)",
               "ms (median, bars: p10-p90)")
    for i, (b, curve) in enumerate(sorted(info.verify.items())):
        ks = sorted(curve)
        fig.add_scatter(x=ks, y=[curve[k].median_ms for k in ks], mode="lines+markers", name=f"B = {b}",
                        line=dict(color=COLORS[i % len(COLORS)]),
                        error_y=_errors([(curve[k].median_ms, curve[k].p10_ms, curve[k].p90_ms) for k in ks]))
    return fig


def draft_step_chart(info: ProfileInfo, drafts: Sequence[str] | None = None) -> go.Figure:
    """T_s vs context length (B = 1), one line per draft (measured)."""
    fig = _fig("T_s vs context length: one draft forward, B = 1 (measured)", "context length (tokens in the KV cache)",
               "ms (median, bars: p10-p90)")
    for i, (draft, by_b) in enumerate(sorted(info.draft_steps.items())):
        if drafts is not None and draft not in drafts:
            continue
        curve = by_b.get(1) or next(iter(by_b.values()))
        cs = sorted(curve)
        fig.add_scatter(x=cs, y=[curve[c].median_ms for c in cs], mode="lines+markers", name=short_name(draft),
                        line=dict(color=COLORS[i % len(COLORS)]),
                        error_y=_errors([(curve[c].median_ms, curve[c].p10_ms, curve[c].p90_ms) for c in cs]))
    return fig


def draft_step_batch_chart(info: ProfileInfo, drafts: Sequence[str] | None = None) -> go.Figure:
    """T_s(B) at the typical context, one bar group per batch size (measured)."""
    fig = _fig(f"T_s(B) at the typical context ({info.typical_context} tokens, measured)", "batch size B", "ms (median)",
               barmode="group", xaxis_type="category")
    for i, (draft, by_b) in enumerate(sorted(info.draft_steps.items())):
        if drafts is not None and draft not in drafts:
            continue
        bs = sorted(by_b)
        med = [by_b[b].get(info.typical_context or -1) or list(by_b[b].values())[-1] for b in bs]
        fig.add_bar(x=[str(b) for b in bs], y=[m.median_ms for m in med], name=short_name(draft),
                    marker_color=COLORS[i % len(COLORS)])
    return fig


def acceptance_chart(panels: Sequence[AcceptancePanel], rate: str = "alpha") -> go.Figure:
    """Acceptance by draft position (measured): ``alpha`` = conditional α_i, ``beta`` = per-cycle β_i (vLLM's)."""
    title = ("α_i by draft position (measured): P(accepted | earlier accepted)" if rate == "alpha" else
             "β_i by draft position (measured, vLLM's per-position rate): accepted at i ÷ cycles")
    fig = _fig(title, "draft position i", "α_i" if rate == "alpha" else "β_i", yaxis_range=[0, 1.05])
    for i, p in enumerate(panels):
        values = list(p.alpha if rate == "alpha" else p.beta)
        fig.add_scatter(x=list(range(1, len(values) + 1)), y=values, mode="lines+markers",
                        name=f"{short_name(p.draft)} ({p.mode})", line=dict(color=COLORS[i % len(COLORS)],
                                                                            dash="dash" if p.mode == "sampling" else None))
    return fig


def calibration_chart(panels: Sequence[AcceptancePanel], thresholds: Sequence[float]) -> go.Figure:
    """Share of drafted tokens accepted per draft-confidence bin (measured), θ grid as dotted lines."""
    fig = _fig("Acceptance vs draft confidence (measured; dotted: θ values the tuner considers)",
               "draft confidence (top probability)", "accepted ÷ drafted", xaxis_range=[0, 1], yaxis_range=[0, 1.05])
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated (y = x)", line=dict(color="#aaa", dash="dot"))
    for i, p in enumerate(panels):
        pts = [((lo + hi) / 2, acc / n, n) for lo, hi, n, acc in p.calibration if n > 0]
        if not pts:
            continue
        fig.add_scatter(x=[x for x, _, _ in pts], y=[y for _, y, _ in pts], mode="lines+markers",
                        name=f"{short_name(p.draft)} ({p.mode})", line=dict(color=COLORS[i % len(COLORS)]),
                        customdata=[n for _, _, n in pts], hovertemplate="conf %{x:.2f}: %{y:.2f} of %{customdata}")
    for t in thresholds:
        if t > 0:
            fig.add_vline(x=t, line=dict(color="#bbb", width=1, dash="dot"))
    return fig


def bias_front_chart(rows: Sequence[BiasFrontRow], draft: str) -> go.Figure:
    """Rejection vs bias per verified position of Decoding-OPT and -UNO over ε: theory (exact at
    teacher-forced positions) as lines, measured (lossy decoding runs) as open markers, and Theorem 5's
    bound, bias ≥ TV − rejection with TV the exact rule's rejection (Yin et al. 2024)."""
    fig = _fig(f"Lossy acceptance, {short_name(draft)}: rejection vs bias (theory lines, measured markers)",
               "rejection probability per verified position", "bias: mean TV(emitted, target)")
    for i, method in enumerate(("opt", "uno")):
        for source, mode in (("theory", "lines+markers"), ("measured", "markers")):
            pts = sorted((r for r in rows if r.method == method and r.source == source), key=lambda r: r.epsilon)
            if not pts:
                continue
            marker = dict(color=COLORS[i], symbol="circle" if source == "theory" else "circle-open", size=9)
            fig.add_scatter(x=[r.rejection for r in pts], y=[r.bias for r in pts], mode=mode, marker=marker,
                            name=f"Decoding-{method.upper()}, {source}", text=[f"ε = {r.epsilon:g}" for r in pts],
                            hovertemplate="%{text}: rejection %{x:.3f}, bias %{y:.4f}")
    exact = next((r for r in rows if r.method == "opt" and r.source == "theory" and r.epsilon == 0), None)
    if exact is not None:
        tv = exact.rejection
        fig.add_scatter(x=[0, tv], y=[tv, 0], mode="lines", line=dict(color="black", dash="dash"),
                        name=f"Theorem 5: bias ≥ TV − rejection (TV = {tv:.3f}); nothing lies below")
    return fig


def telemetry_chart(info: ProfileInfo) -> go.Figure:
    """NVML power and memory over the run (measured)."""
    fig = _fig("Device telemetry (NVML, measured)", "seconds since the run started", "W / MB")
    rows = info.telemetry
    for field, name in (("power_w", "power (W)"), ("memory_used_mb", "memory used (MB)"),
                        ("sm_clock_mhz", "SM clock (MHz)")):
        ys = [getattr(r, field) for r in rows]
        if any(y is not None for y in ys):
            fig.add_scatter(x=[r.t for r in rows], y=ys, mode="lines", name=name)
    return fig


def budget_chart(budgets: Sequence[CycleBudget]) -> go.Figure:
    """Predicted time per generated token, split into draft steps, verify and overhead (÷ E[τ])."""
    labels = [f"{b.label}  (E[τ] {b.tokens_per_cycle:.2f})" for b in budgets]
    fig = _fig("Where the time goes: predicted ms per generated token (cycle ÷ E[τ])", "ms per token", "",
               barmode="stack", height=80 + 48 * len(budgets))
    for part, color, get in (("draft steps", COLORS[1], lambda b: b.draft_ms), ("verify", COLORS[0], lambda b: b.verify_ms),
                             ("overhead", COLORS[7], lambda b: b.overhead_ms)):
        fig.add_bar(y=labels, x=[get(b) / b.tokens_per_cycle for b in budgets], name=part, orientation="h",
                    marker_color=color, customdata=[get(b) for b in budgets],
                    hovertemplate="%{x:.2f} ms/token (%{customdata:.2f} ms per cycle)")
    fig.update_yaxes(autorange="reversed")
    return fig


def heatmap_chart(hm: HeatMap) -> go.Figure:
    """Predicted tokens/s over (N, θ) with the measured points (hover: measured, CI, prompts)."""
    fig = _fig(f"{short_name(hm.draft)}: predicted tokens/s over N and θ (circles: measured)",
               "N (num_speculative_tokens)", "θ (threshold)", legend=dict(orientation="h", y=-0.25),
               height=max(260, 120 + 34 * len(hm.thresholds)))
    # Category axes: one cell per N and per θ of the grid (an n-gram draft has the single row θ = 0).
    fig.add_heatmap(x=[str(n) for n in hm.ns], y=[f"{t:g}" for t in hm.thresholds], z=[list(r) for r in hm.tokens_per_s],
                    colorscale="Viridis", colorbar=dict(title="tokens/s"),
                    hovertemplate="N=%{x} θ=%{y}: %{z:.1f} tokens/s predicted<extra></extra>")
    if hm.measured:
        text = [f"measured {m.measured:.1f} tokens/s" + (f" [{m.ci[0]:.1f}, {m.ci[1]:.1f}]" if m.ci else "")
                + (f", predicted {m.predicted:.1f}" if m.predicted is not None else "") + f" ({m.split})"
                for m in hm.measured]
        fig.add_scatter(x=[str(m.num_speculative_tokens) for m in hm.measured], y=[f"{m.threshold:g}" for m in hm.measured],
                        mode="markers+text", text=[f"{m.measured:.0f}" for m in hm.measured], textposition="top center",
                        textfont=dict(color="white"), hovertext=text, hoverinfo="text", name="measured",
                        marker=dict(size=13, color="rgba(0,0,0,0)", line=dict(color="white", width=2)))
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def fidelity_chart(info: FidelityInfo) -> go.Figure:
    """Measured vs predicted tokens/s, in-sample and held-out apart, CI bars, y = x line."""
    fig = _fig("Model vs measurement: tokens/s (bars: measured 95% CI)", "predicted tokens/s", "measured tokens/s")
    pts = info.points
    if pts:
        lo = min(min(p.predicted, p.measured) for p in pts) * 0.95
        hi = max(max(p.predicted, p.measured) for p in pts) * 1.05
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x (perfect prediction)",
                        line=dict(color="#888", dash="dash"))
    for split, color, symbol in ((HELD_OUT, COLORS[2], "circle"), ("in-sample", COLORS[0], "diamond-open")):
        group = [p for p in pts if p.split == split]
        if not group:
            continue
        has_ci = any(p.ci for p in group)
        fig.add_scatter(
            x=[p.predicted for p in group], y=[p.measured for p in group], mode="markers", name=split,
            marker=dict(color=color, size=10, symbol=symbol), text=[p.label for p in group],
            hovertemplate="%{text}<br>predicted %{x:.1f}, measured %{y:.1f} tokens/s",
            error_y=_errors([(p.measured, *(p.ci or (p.measured, p.measured))) for p in group]) if has_ci else None,
        )
    return fig


def trend_chart(points: Sequence[TrendPoint], metric: str, title: str, unit: str) -> go.Figure:
    """One metric per benchmark over the regression runs (CI bars where computed; red: flagged)."""
    fig = _fig(title, "regression run (finished)", unit)
    benches = sorted({p.benchmark for p in points if p.metric == metric})
    for i, bench in enumerate(benches):
        series = sorted((p for p in points if p.metric == metric and p.benchmark == bench), key=lambda p: p.when)
        has_ci = any(p.ci for p in series)
        fig.add_scatter(x=[p.when for p in series], y=[p.value for p in series], mode="lines+markers", name=bench,
                        line=dict(color=COLORS[i % len(COLORS)]), customdata=[p.regress_run for p in series],
                        hovertemplate="run %{customdata}: %{y:.3g}",
                        error_y=_errors([(p.value, *(p.ci or (p.value, p.value))) for p in series]) if has_ci else None)
    hot = [p for p in points if p.metric == metric and p.verdict in ("flagged", "regression", "suspicious", "fail")]
    if hot:
        fig.add_scatter(x=[p.when for p in hot], y=[p.value for p in hot], mode="markers", name="flagged change",
                        marker=dict(color="red", size=14, symbol="x-thin-open", line=dict(width=3)),
                        text=[p.benchmark for p in hot], hovertemplate="%{text}: flagged in run")
    return fig
