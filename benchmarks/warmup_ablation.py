"""The draft's in-cycle warm-up term, ablated on stored measurements: predicted speedups with and without it.

A cycle's draft forwards warm up one after another (``tuner.model.ModelProfile.draft_warmup_s``). This
script reads a results database that a fidelity script filled (``fidelity.py``, ``latency_fidelity.py``:
profile run 1 and its measured runs), predicts every measured model-draft configuration twice from the
same profile, with the term and with every forward at T_s, and compares both with the *same*
measurement: a paired comparison, so the machine's drift between runs, which on the 2-core VM moves a
configuration's measured speedup by up to 13 % between two measurements, cancels. Speedups are each
configuration's tokens/s over plain decoding's measured in the same interleaved passes, predicted at
the profile's machine speed. Nothing is measured here (seconds).

Usage:

    python benchmarks/warmup_ablation.py --db sqlite:////tmp/fid_w.db
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Annotated

import typer

from specdec_tune.cli import _options as opts
from specdec_tune.db import get_run, list_measured, open_database
from specdec_tune.tuner.model import PromptSpec, SpecConfig, load_run_profile, predict_prompts

Db = Annotated[str, typer.Option("--db", metavar="URL", help="A database a fidelity script filled.")]
RunId = Annotated[int, typer.Option("--run", help="The profile run whose measurements are compared.")]


def main(db: Db, run: RunId = 1) -> None:
    database = open_database(db)
    record = get_run(database, run)
    index = {pid: i for i, pid in enumerate(record.settings.prompt_ids)}
    groups: dict[tuple, list] = {}
    sessions: dict[tuple, int] = {}
    for m in sorted(list_measured(database, run), key=lambda r: r.id):
        if "prompt_ids" not in m.config:  # the profile's own baseline row, not a measure_configs run
            continue
        key = (m.config.get("split"), tuple(m.config["prompt_ids"]))
        session = sessions.get(key, 0) + (m.draft is None)  # each measure_configs call starts with plain decoding
        sessions[key] = session
        groups.setdefault((*key, session), []).append(m)
    profiles: dict[tuple, object] = {}

    def profile(draft, warm: bool):
        if (draft, warm) not in profiles:
            rp = load_run_profile(database, run, draft, baseline_only=draft is None)
            profiles[draft, warm] = rp if warm else replace(rp, model=replace(rp.model, draft_warmup_s=()))
        return profiles[draft, warm]

    for (split, prompt_ids, _), measured in groups.items():
        plain = next((m for m in measured if m.draft is None), None)
        if plain is None:
            continue
        specs = [PromptSpec(n, None, index.get(pid)) for pid, n in zip(prompt_ids, plain.config["prompt_tokens"])]
        predicted_plain = predict_prompts(profile(None, True), SpecConfig(0), specs).tokens_per_s
        errors: dict[bool, list[float]] = {True: [], False: []}
        print(f"{split}, {len(prompt_ids)} prompts (measured run ids {measured[0].id}-{measured[-1].id})")
        for m in measured:
            if m.draft in (None, "ngram"):
                continue
            config = SpecConfig(m.config["num_speculative_tokens"], m.config["threshold"])
            speedup = m.measured_tokens_per_s / plain.measured_tokens_per_s
            cells = []
            for warm in (False, True):
                p = predict_prompts(profile(m.draft, warm), config, specs).tokens_per_s / predicted_plain
                errors[warm].append(abs(p / speedup - 1))
                cells.append(f"{'with' if warm else 'without'} {p:.3f} ({(p / speedup - 1) * 100:+.1f}%)")
            print(f"  {m.draft} N={config.spec.num_speculative_tokens} θ={config.spec.threshold:g}: measured {speedup:.3f}; "
                  f"predicted {'; '.join(cells)}")
        print(f"  median |speedup error|: without the warm-up term {statistics.median(errors[False]) * 100:.1f}%, "
              f"with it {statistics.median(errors[True]) * 100:.1f}% ({len(errors[True])} configurations)")


if __name__ == "__main__":
    opts.run_script(main)
