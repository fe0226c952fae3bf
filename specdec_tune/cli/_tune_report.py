"""What ``specdec-tune tune`` prints: the report on the terminal (the winner, the confirmation table, each
server's decision, the study) and the ``--json`` object."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdec_tune.cli import _operator as ops
from specdec_tune.cli._app import THROUGHPUT_NOTE


def _fmt_ci(ci) -> str:
    return "–" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _rate(x) -> str:
    return "–" if x is None else f"{x:.1f}"


def report_json(report) -> dict:
    """The ``--json`` object: the winner's configuration and measured speedup first, then the evidence."""
    r = report.result
    c = r.candidate
    files = file_cells(r, report.not_written)
    return {
        "drafter": c.drafter, "num_speculative_tokens": c.num_speculative_tokens, "threshold": c.threshold,
        "threshold_rule": c.threshold_rule, "threshold_kind": c.threshold_kind,
        "threshold_step": c.threshold_step if c.threshold_kind == "adaptive" else None,
        "acceptance": c.acceptance, "epsilon": c.epsilon, "bias": r.bias, "bias_front": r.pareto,
        "schedule": c.schedule, "server": r.server,
        "measured_tokens_per_s": r.measured_tokens_per_s, "predicted_tokens_per_s": r.predicted_tokens_per_s,
        "predicted_basis": r.predicted_basis, "baseline_tokens_per_s": r.baseline_tokens_per_s, "speedup": r.speedup,
        "speedup_ci": list(r.speedup_ci) if r.speedup_ci else None, "heldout": r.heldout, "study": report.study,
        "exports": report.exports,
        "per_batch_size": {str(b): n for b, n in r.per_batch_size.items()},
        "best_per_server": {srv: {**entry, **({"file_carries": files[srv]} if srv in files else {})}
                            for srv, entry in r.best_per_server.items()},
        "not_written": report.not_written, "storage": report.storage, "run_id": report.run_id,
        "profiled": report.profiled, "completed_trials": report.completed_trials, "new_trials": report.new_trials,
        "trial_counts": report.trial_counts(),
        "sampler": report.sampler, "confirmation": report.confirmation, "pareto": report.pareto,
        "notes": report.notes, "throughput": THROUGHPUT_NOTE,
        "backend": "vllm" if report.server_report else "engine", "server_report": report.server_report,
        "threads": report.threads, "objective": r.objective,
        "per_batch_size_reasons": {str(b): why for b, why in r.per_batch_size_reasons.items()},
    }


def print_report(console: Console, report) -> None:
    """The report on the terminal (``tune`` without ``--json``)."""
    r = report.result
    c = r.candidate
    where = "held-out prompts" if r.heldout else "tuning prompts"
    console.print(f"[bold]winner[/bold] ({r.server}): {c.label()}", highlight=False)
    console.print(f"  measured on {where}: {_rate(r.measured_tokens_per_s)} tokens/s vs plain decoding "
                  f"{_rate(r.baseline_tokens_per_s)} tokens/s: speedup {r.speedup:.2f}× (95% CI {_fmt_ci(r.speedup_ci)}); "
                  f"predicted {_rate(r.predicted_tokens_per_s)} tokens/s{_for(r.predicted_basis)}", highlight=False)
    if r.per_batch_size:
        console.print(f"  best N per batch size ({r.per_batch_size_source}; 0 = do not speculate): "
                      + ", ".join(f"B={b}: {n}" for b, n in r.per_batch_size.items()), highlight=False)
        for line in ops.reason_lines(r.per_batch_size_reasons):
            console.print(line, highlight=False)
    for line in ops.objective_lines(r.objective):
        console.print(line, highlight=False)
    if report.threads:
        from specdec_tune.profiler import ThreadChoice

        console.print("  " + ThreadChoice(**report.threads).text(), highlight=False, markup=False)
    if report.server_report:
        _print_server(console, report.server_report)
    console.print(_confirmation_table(report))
    console.print(bases_line(report.confirmation), highlight=False)
    if r.best_per_server:
        _print_servers(console, r, report.not_written)
    for fmt, why in report.not_written.items():
        if fmt not in r.best_per_server:
            console.print(f"note: {fmt} files not written: {why}", highlight=False, markup=False)
    if r.bias:
        b = r.bias
        measured = "" if b.get("measured_bias") is None else f", measured {b['measured_bias']:.4f}"
        console.print(f"  bias {b['bias']:.4f} per verified position (predicted: {b['label']}{measured}; budget "
                      f"{b['budget'] if b['budget'] is not None else '–'})", highlight=False)
    if r.pareto:
        console.print("throughput ↔ bias front (predicted; stored with the study's result): " + "; ".join(
            f"{p['label']}: {p['predicted_tokens_per_s']:.1f} tokens/s, bias {p['bias']:.4f}" for p in r.pareto),
            highlight=False)
    elif len(report.pareto) > 1:
        names = report.pareto[0].get("objectives") or ["throughput", "memory"]
        console.print(f"Pareto front (predicted {' vs '.join(names)}): " + "; ".join(
            f"{p['label']}: " + ", ".join(ops._value(n, p.get('values', {}).get(n)) for n in names)
            for p in report.pareto), highlight=False)
    console.print(f"study {report.study!r} in {report.storage} ({report.sampler}): {trials_text(report)}; profile run "
                  f"{report.run_id} ({'new' if report.profiled else 'reused'}; `--run {report.run_id}` names it for "
                  "predict, measure and export)", highlight=False)
    for note in report.notes:
        console.print(f"note: {note}", highlight=False)
    for path in report.exports:
        console.print(f"exported: {path}", highlight=False)
    console.print(f"throughput is {THROUGHPUT_NOTE}", highlight=False)


def _confirmation_table(report) -> Table:
    """The configurations measured on the tuning prompts, the winner marked."""
    table = Table(title="measured on the tuning prompts" + (" (vLLM, one engine start each)" if report.server_report
                                                             else " (interleaved)"), title_justify="left")
    for col in ("configuration", "measured tokens/s", "95% CI", "speedup (measured, median over passes)",
                "predicted tokens/s", "servers"):
        table.add_column(col)
    for row in report.confirmation:
        speedup = row.get("measured_speedup")
        table.add_row(("→ " if row["winner"] else "  ") + row["label"], _rate(row["measured_tokens_per_s"]),
                      _fmt_ci(row["measured_ci"]), "–" if speedup is None else f"{speedup:.2f}×",
                      _rate(row["predicted_tokens_per_s"]), ", ".join(row["servers"]))
    return table


def file_cells(r, not_written: dict[str, str]) -> dict[str, str]:
    """Each decided server's "file carries" cell: the configuration its file carries, or ``not written:
    <why>`` for a format the export asked for and could not write."""
    from specdec_tune.tuner.model import decisions

    return {srv: f"not written: {not_written[srv]}" if srv in not_written else d.shipped.label()
            for srv, d in decisions(r).items()}


def _for(basis: str | None) -> str:
    """`` (for <basis>)``: what a predicted rate was computed for, where the result says."""
    return f" (for {basis})" if basis else ""


def bases_line(rows: list[dict]) -> str:
    """What the predicted column of a table of measured configurations was computed for, grouped (the
    rows' predictions differ from the search's and from the held-out ones: other prompts, other passes)."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row.get("predicted_basis") or "–", []).append(row["label"])
    if len(groups) == 1:
        return f"  predicted tokens/s above: for {next(iter(groups))}"
    return "  predicted tokens/s above: " + "; ".join(f"{', '.join(labels)}: for {basis}"
                                                      for basis, labels in groups.items())


def trials_text(report) -> str:
    """The study's trial counts, adding up: completed = run now + earlier (or by another process); the
    trials run now that did not complete are counted apart."""
    c = report.trial_counts()
    text = (f"{c['completed']} completed trials = {c['completed_new']} run now + {c['completed_other']} from earlier "
            "runs or other processes")
    for key, end in (("pruned_new", "pruned (the model cannot predict them from this profile, or they exceed the "
                                    "memory budget)"), ("failed_new", "failed")):
        if c[key]:
            text += f"; {c[key]} more trial{'s' if c[key] > 1 else ''} run now {'were' if c[key] > 1 else 'was'} {end}"
    return text


def _print_servers(console: Console, r, not_written: dict[str, str]) -> None:
    """Each server's measured pick and what its file carries (the decision and why), or why it was not written."""
    from specdec_tune.tuner.model import decisions

    decided = decisions(r)
    files = file_cells(r, not_written)
    table = Table(title="each server: its best measured inside its space, held out against plain decoding "
                        "(interleaved); the file carries it when the CI's lower bound is >= 1",
                  title_justify="left")
    for col in ("server", "configuration", "predicted tokens/s", "measured tokens/s", "speedup (measured, 95% CI)",
                "file carries"):
        table.add_column(col)
    for srv, d in decided.items():
        speedup = "–" if d.speedup is None else f"{d.speedup:.2f}× {_fmt_ci(d.speedup_ci)}"
        table.add_row(srv, d.candidate.label(), _rate(d.predicted_tokens_per_s), _rate(d.measured_tokens_per_s),
                      speedup, Text(files[srv]))
    console.print(table)
    console.print(bases_line([{"label": srv, "predicted_basis": d.predicted_basis} for srv, d in decided.items()]),
                  highlight=False)
    for srv, d in decided.items():
        if not d.speculates and not d.candidate.is_plain:
            console.print(f"note: {srv} carries plain decoding: {d.reason}", highlight=False)


def _print_server(console: Console, sr: dict) -> None:
    """Per batch size on the held-out prompts, measured on vLLM: the schedule as a whole, the winner's
    constant N and plain decoding."""
    table = Table(title="measured on vLLM, held-out prompts, per batch size (tokens/s, all requests)",
                  title_justify="left")
    for col in ("B", "schedule N", "schedule", "constant N (winner)", "plain", "schedule ÷ plain", "constant ÷ plain"):
        table.add_column(col)
    for row in sr["heldout"]:
        sch, const, plain = row.get("schedule"), row.get("constant"), row["plain"]
        cell = lambda x: "–" if not x else f"{x['measured_tokens_per_s']:.1f} {_fmt_ci(x['ci95'])}"  # noqa: E731
        ratio = lambda x: "–" if not x else f"{x['speedup']:.2f}× {_fmt_ci(x['speedup_ci'])}"  # noqa: E731
        table.add_row(str(row["batch_size"]), str(row["schedule_n"]), cell(sch) if sch else "(= constant)",
                      cell(const), cell(plain), ratio(sch), ratio(const))
    console.print(table)
    close = sr.get("close_calls") or []
    if close:
        ci = lambda r: f"95% CI {r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}" if r["ci95"] else "no 95% CI: one prompt"  # noqa: E731
        console.print(f"note: the best measured, {sr.get('best_measured')}, is not measurably faster than " + "; ".join(
            f"{r['config']} (ratio {r['ratio']:.2f}, {ci(r)})" for r in close)
            + " on the tuning prompts; among these the calibrated model chose the winner where it interpolates "
            "(more --measure-prompts would let the measurement decide)", highlight=False)
    for b, by_n in sr.get("schedule_measured", {}).items():
        console.print(f"schedule at B={b} chosen from measured tokens/s (tuning prompts): " + ", ".join(
            f"{'plain' if n == '0' else 'N=' + n} {v:.1f}" for n, v in sorted(by_n.items(), key=lambda x: int(x[0]))),
            highlight=False)
    model = sr["server_model"]["times"]
    console.print("server model (calibrated on vLLM, tuning prompts): " + "; ".join(
        f"B={b}: step {t['step_s'] * 1e3:.2f} ms" + "".join(
            f", {k} +{t['spec_step_s'][k] * 1e3:.2f} ms/step +{t['per_draft_token_s'][k] * 1e3:.2f} ms/draft token"
            for k in t["spec_step_s"]) for b, t in model.items()), highlight=False)
