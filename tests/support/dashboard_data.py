"""A results database and a study storage filled by the project's own code, for the dashboard tests.

The database holds a real profile of the tiny test models (model draft + n-gram, batch sizes 1 and 2,
the same flags as ``tests/cli/test_profile.py``) and two configurations measured with ``measure`` (each
stored next to the tuner's prediction). The study storage holds Optuna studies in the shape
``specdec-tune tune`` writes: trials over (drafter, N, θ) whose values are the tuner's predictions for
this run, and a ``result`` user attribute holding a :class:`~specdec_tune.tuner.model.TuningResult`.
Built once per test session (cached under pytest's base temp folder) and shared by the test modules.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

# Six prompts: the held-out half has at least two, the fewest a measured CI is computed from.
WORKLOAD = ('{"id": "a", "prompt": "def add(a, b):"}\n{"id": "b", "prompt": "class Point:"}\n'
            '{"id": "c", "prompt": "for i in range(10):"}\n{"id": "d", "prompt": "print(i, i * i)"}\n'
            '{"id": "e", "prompt": "def sub(a, b):"}\n{"id": "f", "prompt": "return a + b"}\n')
TINY_FLAGS = ["--device", "cpu", "--repeats", "2", "--k-max", "3", "--n-max", "4", "--max-prompts", "2",
              "--max-new-tokens", "8", "--context-lens", "8,16"]
STUDY = "tiny-vllm"
PARETO = "tiny-pareto"


def _profile_and_measure(root: Path, dirs: dict[str, str]) -> str:
    from specdec_tune.cli import main

    workload = root / "w.jsonl"
    workload.write_text(WORKLOAD)
    url = f"sqlite:///{root / 'results.db'}"
    assert main(["profile", "--target", dirs["target"], "--draft", f"{dirs['draft']},ngram", "--workload",
                 str(workload), "--db", url, "--json", "--batch-sizes", "1,2", *TINY_FLAGS]) == 0
    assert main(["measure", "--run", "1", "-N", "2", "--threshold", "0.3", "--repeats", "2", "--db", url, "--json"]) == 0
    assert main(["measure", "--run", "1", "-N", "1", "--draft", "ngram", "--repeats", "2", "--db", url, "--json"]) == 0
    return url


def _fill_studies(db_url: str, storage_url: str) -> None:
    """Two studies whose trial values are the tuner's predictions for run 1 (no re-implementation)."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    from optuna.trial import create_trial

    from specdec_tune.db import get_run, list_measured, open_database
    from specdec_tune.tuner.model import (
        Candidate,
        SpecConfig,
        TuningResult,
        best_n_per_batch_size,
        load_run_profile,
        predict_config,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = open_database(db_url)
    run = get_run(db, 1)
    profiles = {d: load_run_profile(db, 1, d) for d in run.draft_names}
    dists = {"drafter": CategoricalDistribution(run.draft_names), "num_speculative_tokens": IntDistribution(1, 4),
             "threshold": FloatDistribution(0.0, 0.9)}
    trials, pareto = [], []
    reach = {d: max(len(t.confidences) for t in rp.model.traces) for d, rp in profiles.items()}  # what traces replay
    for drafter in run.draft_names:
        for n in range(1, reach[drafter] + 1):
            for theta in ((0.0,) if drafter == "ngram" else (0.0, 0.3, 0.6)):
                p = predict_config(profiles[drafter], SpecConfig(n, theta))
                params = {"drafter": drafter, "num_speculative_tokens": n, "threshold": theta}
                attrs = {"predicted_tokens_per_s": p.tokens_per_s, "predicted_tau": p.expected_tokens_per_cycle}
                trials.append(create_trial(params=params, distributions=dists, value=p.tokens_per_s, user_attrs=attrs))
                memory = 1000.0 * n + (0 if drafter == "ngram" else 5000.0)  # a stand-in second objective
                pareto.append(create_trial(params=params, distributions=dists, values=[p.tokens_per_s, memory],
                                           user_attrs=attrs))
    study = optuna.create_study(study_name=STUDY, storage=storage_url, direction="maximize")
    study.add_trials(trials)
    best = study.best_trial
    rp = profiles[best.params["drafter"]]
    measured = [m for m in list_measured(db, 1) if m.draft is not None]
    baseline = next(m for m in list_measured(db, 1) if m.draft is None)
    schedule = best_n_per_batch_size(rp.model, sorted(rp.model.verify_s), range(1, reach[best.params["drafter"]] + 1))
    result = TuningResult(
        candidate=Candidate(best.params["drafter"], best.params["num_speculative_tokens"], best.params["threshold"]),
        server="vllm", target=run.target.name, workload=run.workload.name, hardware=run.hardware.device_name,
        per_batch_size=dict(schedule), predicted_tokens_per_s=best.value,
        measured_tokens_per_s=measured[0].measured_tokens_per_s, baseline_tokens_per_s=baseline.measured_tokens_per_s,
        speedup=measured[0].measured_tokens_per_s / baseline.measured_tokens_per_s,
        speedup_ci=(0.5, 1.5),  # a fixture value: the dashboard shows whatever CI the study stored
        heldout=True, study=STUDY, run_id=1,
    )
    study.set_user_attr("result", result.to_dict())
    multi = optuna.create_study(study_name=PARETO, storage=storage_url, directions=["maximize", "minimize"])
    with warnings.catch_warnings():  # set_metric_names is "experimental" in Optuna; its shape is what tune writes
        warnings.simplefilter("ignore")
        multi.set_metric_names(["throughput", "memory"])
    multi.add_trials(pareto)


def build(base: Path, dirs: dict[str, str]) -> dict[str, str]:
    """Build (once per session) and return ``{"db": url, "storage": url, "empty": url}``."""
    root = base / "dashboard_fixture"
    done = root / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    root.mkdir(parents=True, exist_ok=True)
    db_url = _profile_and_measure(root, dirs)
    storage_url = f"sqlite:///{root / 'studies.db'}"
    _fill_studies(db_url, storage_url)
    urls = {"db": db_url, "storage": storage_url, "empty": f"sqlite:///{root / 'empty.db'}"}
    done.write_text(json.dumps(urls))
    return urls


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RunningDashboard:
    """``specdec-tune dashboard`` in a child process (its own session), stopped with SIGINT like Ctrl-C."""

    def __init__(self, db_url: str, storage_url: str | None = None, timeout_s: float = 120.0) -> None:
        import os
        import subprocess
        import sys

        from specdec_tune.dashboard.launch import wait_healthy

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "specdec_tune.cli", "dashboard", "--db", db_url, "--port", str(self.port)]
        if storage_url:
            args += ["--storage", storage_url]
        env = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_DB", "SPECDEC_STORAGE")}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        if not wait_healthy(self.url, self.proc, timeout_s):
            out, err = self.stop()
            raise RuntimeError(f"dashboard did not start: rc={self.proc.returncode} out={out!r} err={err!r}")
        self.first_line = self.proc.stdout.readline().strip()

    def stop(self, timeout_s: float = 30.0) -> tuple[str, str]:
        """Send SIGINT (Ctrl-C) and return the rest of stdout and stderr."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            import os

            os.killpg(self.proc.pid, signal.SIGKILL)  # the whole session: the CLI and its Streamlit child
            return self.proc.communicate()

    def __enter__(self) -> RunningDashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
