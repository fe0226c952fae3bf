"""A search worker run in a subprocess by tests/tuner/search/test_optuna.py (kill -9, two workers on one study).

Usage: python -m tests.support._tune_worker DB_URL RUN_ID STORAGE_URL STUDY TRIALS LOG [SLEEP_S] [SERVER]
Each completed trial's number is appended to LOG (flushed) after Optuna has stored it.
"""
from __future__ import annotations

import os
import sys
import time


def main(argv: list[str]) -> None:
    db_url, run_id, storage_url, study, trials, log = argv[:6]
    pause = float(argv[6]) if len(argv) > 6 else 0.0
    server = argv[7] if len(argv) > 7 else "any"
    from specdec_tune.db import get_run, open_database
    from specdec_tune.tuner.model import Evaluator
    from specdec_tune.tuner.search import open_storage, run_search, server_search_space

    db = open_database(db_url)
    run = get_run(db, int(run_id))
    drafts = [d for d in run.draft_names if d != "ngram"]
    space = server_search_space(server, drafts, run.settings.n_max, "ngram" in run.draft_names)
    with open(log, "a") as fh:
        def on_trial(trial) -> None:
            fh.write(f"{os.getpid()} {trial.number} {trial.state.name}\n")
            fh.flush()
            if pause:
                time.sleep(pause)

        run_search(Evaluator(db, int(run_id)), space, storage=open_storage(storage_url), study_name=study,
                   trials=int(trials), seed=os.getpid(), on_trial=on_trial)


if __name__ == "__main__":
    main(sys.argv[1:])
