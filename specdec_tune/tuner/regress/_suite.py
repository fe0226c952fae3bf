"""Regression suite files (TOML or YAML), validated with pydantic; errors name file, line and field.

A suite lists benchmarks: what to run (target, draft, configuration or a study's winner, workload,
backend, repeats) and the rules a comparison applies. Example (TOML)::

    name = "nightly"
    [rules]
    min_drop = 0.05          # flag a drop larger than 5 % ...
    q = 0.01                 # ... whose p-value survives Benjamini-Hochberg at q = 0.01
    [[benchmark]]
    name = "functions-1l"
    target = "mini-target"
    draft = "mini-draft-1l"
    workload = "functions"
    num_speculative_tokens = 4

The bundled default suite is ``tuner/regress/suites/default.toml`` (:func:`default_suite_path`).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specdec_tune.core.errors import InputError
from specdec_tune.core.limits import MAX_SPECULATIVE_TOKENS

#: Fingerprint fields whose change makes a baseline's timings incomparable (speed verdicts need the
#: same machine and thread count). Software versions are recorded and reported as "what changed"
#: instead: catching a library, driver or code change is what a nightly regression run is for.
DEFAULT_MUST_MATCH = ("device", "device_name", "device_count", "threads", "backend", "server")


class Rules(BaseModel):
    """How a comparison decides (defaults: a drop > 5 % at BH-adjusted q <= 0.01, persisting)."""

    model_config = ConfigDict(extra="forbid")

    min_drop: float = Field(0.05, ge=0.0, lt=1.0, description="relative drop that counts (0.05 = 5 %)")
    q: float = Field(0.01, gt=0.0, le=1.0, description="Benjamini-Hochberg false discovery rate")
    persist: int = Field(2, ge=1, le=10, description="consecutive flagged runs that make a regression")
    min_samples: int = Field(6, ge=3, description="fewest prompts per side for a speed verdict")
    min_reached: int = Field(20, ge=1, description="fewest cycles reaching a position for its acceptance cell")
    model_error_tolerance: float = Field(0.10, gt=0.0, description="allowed |predicted/measured - 1|")
    resume_tolerance: float = Field(0.10, gt=0.0, lt=1.0, description=(
        "a schedule benchmark fails when acceptance after speculation resumes is below (1 - this) x a fresh "
        "drafter's on the same continuation"))
    bootstrap: int = Field(2000, ge=200, le=100000, description="bootstrap resamples for the CI")
    calibrate_runs: int = Field(3, ge=2, le=50, description="A/A runs of --calibrate")
    machine_probe: bool = Field(True, description="divide the machine probe's speed (profiler.machine_probe) out of "
                                                  "tokens/s and latency; false compares raw absolute speed")


class Fingerprint(BaseModel):
    """Which environment fields a comparable baseline must share."""

    model_config = ConfigDict(extra="forbid")

    must_match: list[str] = Field(default_factory=lambda: list(DEFAULT_MUST_MATCH))


class Benchmark(BaseModel):
    """One benchmark: a configuration on a workload, measured per prompt.

    Either ``num_speculative_tokens`` (with ``threshold``, ``schedule``) or ``study`` (the stored
    Optuna study's winner, its ``TuningResult`` in the study's user attribute ``result``).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    target: str = Field(min_length=1)
    draft: str = Field("none", min_length=1, description="model name/path, 'ngram' or 'none'")
    workload: str = Field(min_length=1)
    prompts: int = Field(12, ge=1, le=1000, description="first prompts of the workload")
    prompt_offset: int = Field(0, ge=0)
    max_new_tokens: int = Field(48, ge=1, le=4096)
    num_speculative_tokens: int | None = Field(None, ge=0, le=MAX_SPECULATIVE_TOKENS)
    threshold: float = Field(0.0, ge=0.0, lt=1.0)
    schedule: Literal["constant", "heuristic"] = "constant"
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    study: str | None = Field(None, description="take the configuration from this study's winner")
    study_storage: str | None = None
    backend: Literal["engine", "vllm"] = Field("engine", description="engine: ours; vllm: vLLM itself (greedy, θ = 0, "
                                                                   "constant N)")
    repeats: int = Field(3, ge=1, le=50)
    device: str = "auto"  # auto: the GPU when there is one
    dtype: Literal["auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 on a GPU, fp32 on a CPU; outside fp32 greedy outputs may part at near-ties")
    forward: str = "auto"
    profile_run: int | None = Field(None, ge=1, description="profile run whose model predicts this benchmark")
    draft_delay_ms: float = Field(0.0, ge=0.0, le=10000.0, description="TEST ONLY: sleep per draft proposal")
    export: str | None = Field(None, description=(
        "an exported folder (tune --export): its vLLM speculative_config.json gives the drafter, N and the "
        "per-batch-size schedule checked under ``load``"))
    per_batch_size: dict[int, int] | None = Field(None, description="batch size -> N at and above it (a schedule)")
    load: list[int] | None = Field(None, min_length=1, description=(
        "batch sizes the server sees, one per block of load_cycles cycles: the schedule's N follows it (a load "
        "that turns speculation off, then falls, checks that acceptance comes back: TensorRT-LLM #16888)"))
    load_cycles: int = Field(8, ge=1, le=1000)
    batch_sizes: list[int] | None = Field(None, min_length=1, description=(
        "batch sizes (>= 2) at which each band of the schedule (per_batch_size or export) is checked on the batched "
        "engine: the band's N decodes batches of that many prompts, each against the same batch decoded plainly"))

    @model_validator(mode="after")
    def _one_config_source(self) -> Benchmark:
        sources = (self.num_speculative_tokens is not None) + (self.study is not None) + (self.export is not None)
        if sources == 0:
            raise ValueError("give num_speculative_tokens (with threshold, schedule) or study")
        if self.study is not None and self.num_speculative_tokens is not None:
            raise ValueError("give num_speculative_tokens or study, not both")
        if sources > 1:
            raise ValueError("give one of num_speculative_tokens, study or export")
        if self.study is not None and not self.study_storage:
            raise ValueError("study needs study_storage (the Optuna storage URL)")
        if self.backend == "vllm" and (self.temperature > 0 or self.threshold > 0 or self.schedule != "constant"):
            raise ValueError("backend vllm runs greedy decoding with threshold 0 and a constant schedule")
        if self.load is not None and (self.export is None and self.per_batch_size is None):
            raise ValueError("load needs a schedule: per_batch_size or export")
        if self.batch_sizes is not None:
            if self.export is None and self.per_batch_size is None:
                raise ValueError("batch_sizes checks a schedule's bands: give per_batch_size or export")
            if self.backend != "engine" or any(b < 2 for b in self.batch_sizes):
                raise ValueError("batch_sizes are checked on our engine (backend engine), each >= 2")
            if max(self.batch_sizes) > self.prompts:
                raise ValueError(f"batch size {max(self.batch_sizes)} needs at least that many prompts, got {self.prompts}")
        if self.load is not None and (self.backend != "engine" or self.temperature > 0):
            raise ValueError("a load trace is checked on our engine, greedy (backend engine, temperature 0)")
        return self


class Suite(BaseModel):
    """A regression suite: a name (baselines are per suite name), rules and benchmarks."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    threads: int | None = Field(1, ge=1, le=1024, description="torch threads while measuring")
    rules: Rules = Field(default_factory=Rules)
    fingerprint: Fingerprint = Field(default_factory=Fingerprint)
    benchmark: list[Benchmark] = Field(min_length=1)
    vllm_python: str | None = Field(None, description="Python of the vLLM environment (default: --vllm-python or "
                                                      "SPECDEC_VLLM_PYTHON)")

    @model_validator(mode="after")
    def _one_backend(self) -> Suite:
        if len({b.backend for b in self.benchmark}) > 1:
            raise ValueError("all benchmarks of a suite use one backend (a baseline is per backend)")
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> Suite:
        seen: set[str] = set()
        for b in self.benchmark:
            if b.name in seen:
                raise ValueError(f"benchmark name {b.name!r} is used twice")
            seen.add(b.name)
        return self


def default_suite_path() -> Path:
    """The bundled default suite (bundled models, runs in a few minutes on a CPU)."""
    return Path(__file__).resolve().parent / "suites" / "default.toml"


# --------------------------------------------------------------------------- locating errors


def _toml_line(text: str, loc: tuple[Any, ...]) -> int | None:
    """Line (1-based) of the field at ``loc`` in a TOML suite; the table's header when the key is absent."""
    lines = text.splitlines()
    table, index = "", -1
    want_table = str(loc[0]) if loc and isinstance(loc[0], str) and len(loc) > 1 else ""
    want_index = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    key = next((str(p) for p in reversed(loc) if isinstance(p, str)), None)
    header_line = None
    for no, raw in enumerate(lines, 1):
        line = raw.strip()
        m = re.match(r"^\[\[\s*([A-Za-z0-9_.\-]+)\s*\]\]", line) or re.match(r"^\[\s*([A-Za-z0-9_.\-]+)\s*\]", line)
        if m:
            table = m.group(1)
            if line.startswith("[[") and table == want_table:
                index += 1
                if index == want_index:
                    header_line = no
            elif table == want_table and want_index is None:
                header_line = no
            continue
        in_place = (table == want_table) and (want_index is None or index == want_index)
        if not want_table:
            in_place = table == ""
        if in_place and key and re.match(rf"^{re.escape(key)}\s*=", line):
            return no
    return header_line


def _yaml_line(text: str, loc: tuple[Any, ...]) -> int | None:
    """Line (1-based) of the node at ``loc`` in a YAML suite (the deepest node that exists)."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                return line
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _field_name(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(suite)"


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file (``.toml``, ``.yaml`` or ``.yml``).

    Raises:
        InputError: unreadable file, syntax error or invalid field; one line ``FILE:LINE: FIELD: why``.
    """
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read suite file ({exc.__class__.__name__}: {exc})") from None
    is_yaml = p.suffix.lower() in (".yaml", ".yml")
    if is_yaml:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
            raise InputError(f"{where}: YAML syntax error: {getattr(exc, 'problem', None) or exc}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            m = re.search(r"line (\d+)", str(exc))
            where = f"{p}:{m.group(1)}" if m else str(p)
            raise InputError(f"{where}: TOML syntax error: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}:1: (suite): expected a table/mapping with name and benchmark entries")
    try:
        return Suite.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err.get("loc", ()))
        line = (_yaml_line if is_yaml else _toml_line)(text, loc) or 1
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        given = err.get("input")
        shown = "" if isinstance(given, (dict, list)) or given is None else f" (got {given!r})"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(f"{p}:{line}: {_field_name(loc)}: {msg}{shown}{more}") from None
