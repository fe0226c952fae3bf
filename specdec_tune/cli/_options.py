"""Options and defaults shared by the CLI commands and the benchmark scripts (``benchmarks/*.py``).

An option is a ``typing.Annotated`` alias holding its flag and help; its default is a named constant
given where the option is used (``device: DeviceOption = DEFAULT_DEVICE``), and a command that
requires the option gives none. The benchmark scripts are small Typer apps on the same aliases and
constants (:func:`run_script`); where a script needs another default, its help text says so. Kept
free of heavy imports such as SQLAlchemy.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from specdec_tune.core.limits import MAX_SPECULATIVE_TOKENS

# The CLI's defaults, one name each. A benchmark script uses the name where its option means the same.
DEFAULT_DEVICE = "auto"
DEFAULT_DTYPE = "auto"
DEFAULT_FORWARD = "auto"
DEFAULT_WORKLOAD = "functions"  # bench (profile and tune require --workload)
DEFAULT_NUM_SPECULATIVE_TOKENS = 4  # generate, bench
DEFAULT_MAX_NEW_TOKENS = 64  # generate, profile, bench
TUNE_MAX_NEW_TOKENS = 48  # tune: its profile and its measurements
BENCH_MAX_PROMPTS = 8
PROFILE_MAX_PROMPTS = 16
TUNE_MAX_PROMPTS = 12
DEFAULT_REPEATS = 3  # measure and tune: passes over the prompts, interleaved
DEFAULT_SEED = 0
DEFAULT_THRESHOLD = 0.0
DEFAULT_THRESHOLD_KIND = "per-token"
DEFAULT_THRESHOLD_STEP = 0.05
DEFAULT_SCHEDULE = "constant"
DEFAULT_SERVER = "any"
DEFAULT_TRIALS = 200
DEFAULT_THREADS = "auto"

# The bundled zoo: what the benchmark scripts run by default, where the CLI requires a model.
BUNDLED_TARGET = "mini-target"
BUNDLED_DRAFT = "mini-draft-1l"
BUNDLED_DRAFTS = "mini-draft-1l,mini-draft-2l"

# Help texts, for a command or script whose variant of an option needs its own alias.
TARGET_HELP = "Target model: bundled name (see `zoo list`), local folder or hub id."
DRAFT_HELP = "Draft model sharing the target's tokenizer."
DRAFTS_HELP = "Candidate drafts, comma-separated: draft models and/or 'ngram'."
MODEL_ROOT_HELP = ("The folder holding the models on the serving host: every exported file then names "
                   "DIR/<folder name> for each local model (default: the paths here; each launch.sh also reads "
                   "TARGET_MODEL and DRAFT_MODEL).")
WORKLOAD_HELP = "Bundled workload name (see `zoo list`) or a JSONL prompt file."
MAX_PROMPTS_HELP = "Use the first P prompts of the workload."
MAX_NEW_TOKENS_HELP = "Most new tokens per prompt."
REPEATS_HELP = "Interleaved passes of each measurement."
BUNDLED_NOTE = " Default here: the bundled zoo's (the CLI requires it)."

# The options themselves.
TargetOption = Annotated[str, typer.Option("--target", help=TARGET_HELP)]
DraftOption = Annotated[str, typer.Option("--draft", help=DRAFT_HELP)]
DraftsOption = Annotated[str, typer.Option("--drafts", help=DRAFTS_HELP)]
WorkloadOption = Annotated[str, typer.Option("--workload", help=WORKLOAD_HELP)]
MaxNewTokensOption = Annotated[int, typer.Option("--max-new-tokens", help=MAX_NEW_TOKENS_HELP)]
RepeatsOption = Annotated[int, typer.Option("--repeats", help=REPEATS_HELP)]
NumSpeculativeTokensOption = Annotated[
    int, typer.Option("--num-speculative-tokens", "-N",
                      help=f"N: most tokens drafted per cycle (1..{MAX_SPECULATIVE_TOKENS}).")
]
DeviceOption = Annotated[str, typer.Option("--device", help="auto | cpu | cuda")]
DtypeOption = Annotated[
    str, typer.Option("--dtype", help="auto (bf16 on cuda, fp32 on cpu) | float32 | bfloat16 | float16 (fp32 | bf16 | fp16)")
]
SyntheticAcceptanceOption = Annotated[Optional[str], typer.Option("--synthetic-acceptance", metavar="RATES", help=(
    "Accept draft position i with probability α_i instead of asking the target (for model shapes with random "
    "weights, shape:<name>): 0.7, or α_1,α_2,... (the last repeats). Every number that rests on it is labelled "
    "synthetic."))]
SeedOption = Annotated[int, typer.Option("--seed", help="Sampling seed.")]
ThreadsOption = Annotated[str, typer.Option("--threads", metavar="auto|N", help=(
    "CPU threads per forward: auto (calibrated once per machine and model pair, never more than the CPUs "
    "other processes leave idle; docs/engine.md#threads) or a whole number."))]
ThresholdOption = Annotated[
    float, typer.Option("--threshold", help="θ: stop drafting below this draft confidence (0 disables).")
]
ScheduleOption = Annotated[str, typer.Option("--schedule", help="constant | heuristic")]
ThresholdKindOption = Annotated[str, typer.Option("--threshold-kind", help=(
    "How θ applies: per-token (stop before a position whose top draft probability is below θ) | cumulative "
    "(stop when the drafted prefix's probability times it is below θ) | adaptive (per-token, θ starts at "
    "--threshold and moves one --threshold-step up after a rejection, down after a fully accepted draft, "
    "within [0, 0.9]). All decide before the token is drawn: sampling stays exact."))]
AcceptanceOption = Annotated[str, typer.Option("--acceptance", help=(
    "--temperature > 0: exact (default) | opt (Decoding-OPT: accept with min(1, (p + ε)/q), resample from "
    "Theorem 4's optimal distribution) | uno (Decoding-UNO: the same acceptance, resample from p). Lossy: see "
    "docs/model.md#lossy-acceptance."))]
EpsilonOption = Annotated[float, typer.Option("--epsilon", help="--acceptance opt|uno: the over-acceptance ε in [0, 1].")]
ThresholdStepOption = Annotated[float, typer.Option("--threshold-step", help=(
    "--threshold-kind adaptive: how far one cycle's verdict moves θ."))]
ServerOption = Annotated[str, typer.Option("--server", help=(
    "Deploy target: any (whole space, best per server side by side) | vllm | sglang | trtllm | llamacpp | hf."))]
TrialsOption = Annotated[
    int, typer.Option("--trials", help="Completed trials the study should hold (a rerun resumes).")
]
SuiteOption = Annotated[
    Path | None, typer.Option("--suite", help="Suite file (TOML or YAML); default: the bundled suite.")
]

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="SPECDEC_DB",
        show_envvar=True,
        metavar="URL",
        help=(
            "Results database URL: sqlite:///specdec.db (default, in the current directory), "
            "sqlite:////abs/path.db or postgresql+psycopg://user:password@host/dbname."
        ),
    ),
]

RUN_HELP = ("Profile run id (`profile` and `tune` print it), or 'latest': the newest completed profile run.")

ForwardOption = Annotated[
    str,
    typer.Option(
        "--forward",
        help=(
            "Model forward the engine runs: auto (the lean Llama-family forward when the model supports it, "
            "else Hugging Face's), lean, or hf (Hugging Face's module forward)."
        ),
    ),
]

DEFAULT_CUDA_GRAPHS = "auto"
CudaGraphsOption = Annotated[
    str,
    typer.Option(
        "--cuda-graphs",
        help=(
            "CUDA graphs for the lean forward (draft steps and verify forwards replayed, not launched): auto "
            "(on for CUDA with the lean forward), on (refused where it cannot run), or off (eager)."
        ),
    ),
]

VllmPythonOption = Annotated[
    str | None,
    typer.Option(
        "--vllm-python",
        envvar="SPECDEC_VLLM_PYTHON",
        show_envvar=True,
        metavar="PATH",
        help="Python of the vLLM environment (created by scripts/setup_vllm_env.sh, e.g. .venv-vllm/bin/python).",
    ),
]

# The same flags with the bundled zoo as default, and --db required, for the benchmark scripts.
BundledTargetOption = Annotated[str, typer.Option("--target", help=TARGET_HELP + BUNDLED_NOTE)]
BundledDraftOption = Annotated[str, typer.Option("--draft", help=DRAFT_HELP + BUNDLED_NOTE)]
BundledDraftsOption = Annotated[str, typer.Option("--drafts", help=DRAFTS_HELP + BUNDLED_NOTE)]
RequiredDbOption = Annotated[str, typer.Option("--db", metavar="URL", help=(
    "Results database URL, as the CLI's --db, but required here ($SPECDEC_DB is not read)."))]


def run_script(command: Callable[..., Any]) -> None:
    """Run a benchmark script's ``command`` as a one-command Typer app.

    ``--help`` lists its options under the first paragraph of the script's docstring; a bad flag is
    a usage error (exit 2), and an exception keeps its plain traceback.
    """
    doc = sys.modules[command.__module__].__doc__ or ""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(help=doc.split("\n\n")[0])(command)
    app()
