"""Room for a chart's title: wrapped to the width of a half-page chart, left-aligned, below the toolbar.

Plotly draws its toolbar (the modebar) at the top right of the figure, over whatever is there, and a
title longer than the figure runs out of it. Two charts side by side on a 1400-pixel window are about
500 pixels wide each, so a title is wrapped at :data:`TITLE_CHARS` characters and set below a band of
:data:`TOOLBAR_PX` that the toolbar keeps to itself; the top margin grows by the lines the title
takes, and the figure's height with it, so the plot keeps its size.
"""
from __future__ import annotations

import re
import textwrap

import plotly.graph_objects as go

TITLE_CHARS = 52  # characters per title line (15-px font: about 7 px a character)
TITLE_PX = 15  # title font size
LINE_PX = 20  # one title line
TOOLBAR_PX = 34  # the band above the title where the toolbar sits (26 px high, 2 px from the top)
GAP_PX = 12  # between the title and the plot


def title_lines(text: str) -> list[str]:
    """The title's lines: its own breaks kept, each wrapped at :data:`TITLE_CHARS`."""
    lines: list[str] = []
    for part in re.split(r"<br\s*/?>", text or ""):
        lines += textwrap.wrap(part, TITLE_CHARS) or [""]
    return lines


def fit_title(fig: go.Figure) -> go.Figure:
    """Wrap ``fig``'s title, place it left below the toolbar band, and size the top margin to it."""
    text = fig.layout.title.text or ""
    lines = title_lines(text) if text else []
    top = TOOLBAR_PX + LINE_PX * len(lines) + GAP_PX
    before = fig.layout.margin.t if fig.layout.margin.t is not None else 100  # plotly's default
    # Anchored at the figure's top, below the toolbar's band. Plotly centres a title's lines on that anchor
    # (its first line moves up half a line for every further line), so the pad takes that back.
    pad = TOOLBAR_PX + (len(lines) - 1) * LINE_PX // 2
    layout: dict = dict(title=dict(text="<br>".join(lines), x=0, xref="paper", xanchor="left", y=1, yref="container",
                                   yanchor="top", pad=dict(t=pad), font=dict(size=TITLE_PX)),
                        margin=dict(t=top))
    if fig.layout.height is not None:
        layout["height"] = fig.layout.height + max(0, top - before)
    fig.update_layout(**layout)
    return fig
