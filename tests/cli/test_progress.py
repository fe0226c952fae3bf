"""Progress where stderr is not a terminal (``tune ... 2> log``, a pipe, CI): rich draws its bars only
when the work ends there, so the progress sink also prints plain lines while the work runs."""
from __future__ import annotations

import io

from rich.console import Console

from specdec_tune.cli._progress import EVERY_S, Bar, LazyBar, Lines, progress_bar


def _log() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()  # not a terminal, as a redirected stderr
    return Console(file=buf, width=120), buf


def _progress(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[")]


def test_a_redirected_tune_prints_progress_lines_while_it_runs():
    console, buf = _log()
    assert not console.is_terminal
    with LazyBar(console) as bar:  # what tune uses
        bar.stage("profile", 20)
        for _ in range(20):
            bar.advance()
        bar.stage("search", 200)
        bar.advance(50)
        during = _progress(buf.getvalue())  # before the bar is closed: rich has drawn nothing yet
    assert during[0] == "[0:00] profile: started, 20 steps"
    assert [line.split("] ")[1] for line in during[1:11]] == [f"profile: {2 * i}/20 ({10 * i}%)" for i in range(1, 11)]
    assert during[11:] == ["[0:00] search: started, 200 steps", "[0:00] search: 50/200 (25%)"]


def test_profile_and_measure_bars_print_lines_too():
    console, buf = _log()
    with progress_bar(console) as rich_bar:  # what profile and measure use
        sink = Bar(rich_bar)
        sink.stage("timings", 4)
        sink.advance(4)
        assert _progress(buf.getvalue())[-1].endswith("timings: 4/4 (100%)")


def test_slow_steps_get_a_line_every_interval():
    now = [100.0]
    console, buf = _log()
    lines = Lines(console, clock=lambda: now[0])
    lines.stage("held-out", 1000)
    lines.advance()  # 0.1 %, at once: no line
    now[0] += EVERY_S
    lines.advance()  # 0.2 %, an interval later: a line
    now[0] += 61
    lines.advance()
    assert _progress(buf.getvalue()) == ["[0:00] held-out: started, 1000 steps", "[0:15] held-out: 2/1000 (0%)",
                                         "[1:16] held-out: 3/1000 (0%)"]


def test_a_terminal_gets_the_bar_alone():
    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=True)
    with LazyBar(console) as bar:
        bar.stage("profile", 10)
        bar.advance(10)
    assert not _progress(buf.getvalue())
