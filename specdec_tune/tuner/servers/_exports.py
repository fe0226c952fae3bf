"""Write a tuned configuration in the files each server reads as-is, plus a README.

One builder per format turns a :class:`TuningResult` into files: it asks the capability table
(:mod:`._table`) whether the server can run the configuration, fills the server's
schema (:mod:`._schemas`, pydantic, ``extra="forbid"``) and renders text.
Which configuration each format's files carry (the tuner's measured decision for that server, plain
decoding when its held-out CI reaches below 1) is decided in :mod:`._ship`; the README renders the
same :class:`Shipped` records the files are built from. Writing them (and the README) is :mod:`._write`'s.

Per-batch-size N (``TuningResult.per_batch_size``, the model's best N at each batch size asked) becomes
a step function: batch size B_i's N holds from B_i up to the next batch size asked minus one; batch
size 1 always takes the configuration's own N (measured, where the model's choice at B=1 is a
prediction; :func:`schedule_points`). vLLM
gets it as inclusive ranges ``[[1, hi, K], ...]``; TensorRT-LLM as ``{hi: K}`` (upper-bound keys).
Above the largest batch size asked vLLM keeps the last K and TensorRT-LLM uses 0 (each server's rule).
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from specdec_tune.core.errors import InputError
from specdec_tune.core.speculative import SUFFIX_FIELDS
from specdec_tune.core.trees import parse_tree
from specdec_tune.tuner.model import Candidate, TuningResult
from specdec_tune.tuner.servers import _schemas as sch
from specdec_tune.tuner.servers._eagle import is_head, trtllm_tree_fields
from specdec_tune.tuner.servers._gguf import gguf_sources
from specdec_tune.tuner.servers._paths import DRAFT_VAR, TARGET_VAR, Var, file_paths, model_path
from specdec_tune.tuner.servers._paths import options_script, relocated, script, spliced
from specdec_tune.tuner.servers._ship import Files, Shipped, carried, refusal_text, server_best
from specdec_tune.tuner.servers._table import SERVERS
from specdec_tune.tuner.servers._trtllm_fields import TRTLLM_COMMIT
from specdec_tune.tuner.servers._trtllm_fields import check_options as check_trtllm_options

FORMATS = tuple(SERVERS)  # one file format per server of the capability table
ALL = "all"

__all__ = ["ALL", "FORMATS", "Shipped", "batch_ranges", "build_exports", "model_path", "resolve_formats",
           "schedule_points", "server_best", "ship", "ship_all", "vllm_config"]


def resolve_formats(formats: Sequence[str]) -> tuple[list[str], bool]:
    """The formats asked (``all`` expands to every server) and whether ``all`` was asked.

    Raises:
        InputError: an unknown format (the message lists the valid ones).
    """
    out: list[str] = []
    every = False
    for f in (x.strip().lower() for x in formats if x.strip()):
        if f == ALL:
            every = True
            out += [x for x in FORMATS if x not in out]
        elif f in FORMATS:
            out += [f] if f not in out else []
        else:
            raise InputError(f"unknown export format {f!r}; valid: {', '.join(FORMATS)}, {ALL}")
    if not out:
        raise InputError(f"no export format given; valid: {', '.join(FORMATS)}, {ALL}")
    return out, every


def schedule_points(result: TuningResult) -> dict[int, int]:
    """Batch size -> N as the files mean it: the result's per-batch-size N with batch size 1 taking the
    configuration's own N (the measured one; the model's choice at B = 1 is a prediction). Empty for
    plain decoding or without a per-batch-size N."""
    c = result.candidate
    if c.is_plain or not result.per_batch_size:
        return {}
    points = {int(b): int(n) for b, n in result.per_batch_size.items() if int(b) >= 1}
    points[1] = c.num_speculative_tokens
    return dict(sorted(points.items()))


def batch_ranges(result: TuningResult) -> list[tuple[int, int, int]] | None:
    """Contiguous inclusive ranges ``(lo, hi, N)`` from batch size 1 to the largest asked, or ``None``
    when N does not vary (a constant N needs no schedule)."""
    points = schedule_points(result)
    keys = list(points)
    ranges: list[list[int]] = []
    for i, b in enumerate(keys):
        hi = keys[i + 1] - 1 if i + 1 < len(keys) else b
        if ranges and ranges[-1][2] == points[b]:
            ranges[-1][1] = hi
        else:
            ranges.append([b, hi, points[b]])
    return None if len(ranges) <= 1 else [(lo, hi, n) for lo, hi, n in ranges]


def _refuse(fmt: str, result: TuningResult) -> None:
    refusal = refusal_text(fmt, result)
    if refusal is not None:
        raise InputError(refusal)


def _validated(schema: type, what: str, /, **fields):
    try:
        return schema(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "config"
        raise InputError(f"{what} export fails its schema at {where}: {first.get('msg')}") from None


# --------------------------------------------------------------------------- builders


def _vllm(result: TuningResult) -> Files:
    c = result.candidate
    target, draft = file_paths(result)
    if c.is_plain:
        return [("vllm/launch.sh", script(["vllm", "serve", Var(TARGET_VAR, target)],
                                          "plain decoding: no --speculative-config"))]
    _refuse("vllm", result)
    ranges = batch_ranges(result)
    if c.is_suffix:  # a constant N: vLLM's suffix proposer asserts K == num_speculative_tokens (_suffix_facts)
        ranges = None
    fields: dict = {"method": "ngram" if c.is_ngram else "suffix" if c.is_suffix else "eagle3" if is_head(c)
                    else "draft_model",
                    "num_speculative_tokens": max(n for _, _, n in ranges) if ranges else c.num_speculative_tokens}
    if c.is_ngram:
        fields.update(prompt_lookup_max=c.ngram_max, prompt_lookup_min=c.ngram_min)
    elif c.is_suffix:
        fields.update({f"suffix_decoding_{k[len('suffix_'):]}": getattr(c, k) for k in SUFFIX_FIELDS})
    else:
        fields["model"] = draft
    if ranges:
        fields["num_speculative_tokens_per_batch_size"] = [list(r) for r in ranges]
    cfg = _validated(sch.VllmSpeculativeConfig, "vllm", **fields)
    text = json.dumps(cfg.model_dump(exclude_none=True), indent=2) + "\n"
    inline = json.dumps(cfg.model_dump(exclude_none=True))  # the draft's path becomes $DRAFT_MODEL inside it
    cmd = ["vllm", "serve", Var(TARGET_VAR, target), "--speculative-config",
           inline if c.is_ngram or c.is_suffix else spliced(inline, Var(DRAFT_VAR, draft), json.dumps(draft)[1:-1])]
    note = f"{SERVERS['vllm'].version}: speculative_config.json inline" + (
        "; method suffix needs arctic-inference==0.1.1 beside vLLM" if c.is_suffix else "")
    return [("vllm/speculative_config.json", text), ("vllm/launch.sh", script(cmd, note))]


def _sglang(result: TuningResult) -> Files:
    c = result.candidate
    target, draft = file_paths(result)
    base: list = ["python", "-m", "sglang.launch_server", "--model-path", Var(TARGET_VAR, target)]
    if c.is_plain:
        return [("sglang/launch.sh", script(base, "plain decoding: no --speculative-* flags"))]
    _refuse("sglang", result)
    n = c.num_speculative_tokens
    if c.is_ngram:  # the draft's first token is the last verified one: N + 1 tokens in the window
        args = _validated(sch.SglangSpeculativeArgs, "sglang", speculative_algorithm="NGRAM",
                          speculative_num_draft_tokens=n + 1, speculative_ngram_min_bfs_breadth=1,
                          speculative_ngram_max_bfs_breadth=1)
    else:
        # A token tree (capability table: SGLang's EAGLE-2 tree, eagle:K:B) drafts K per step, verifies B nodes.
        tree = parse_tree(c.tree)
        k, nodes = (tree.width, tree.nodes(n)) if tree is not None else (1, n)
        algorithm = "EAGLE3" if is_head(c) else "STANDALONE"  # one flag set (speculative_hook._handle_eagle_family)
        args = _validated(sch.SglangSpeculativeArgs, "sglang", speculative_algorithm=algorithm,
                          speculative_draft_model_path=draft, speculative_num_steps=n, speculative_eagle_topk=k,
                          speculative_num_draft_tokens=nodes + 1)
    flags = args.flags()
    words = [Var(DRAFT_VAR, draft) if i and flags[i - 1] == "--speculative-draft-model-path" else f
             for i, f in enumerate(flags)]
    return [("sglang/flags.txt", "\n".join(flags) + "\n"),
            ("sglang/launch.sh", script(base + words, SERVERS["sglang"].version))]


def _trtllm(result: TuningResult) -> Files:
    import yaml

    c = result.candidate
    target, draft = file_paths(result)
    base: list = ["trtllm-serve", Var(TARGET_VAR, target), "--backend", "pytorch"]
    if c.is_plain:
        return [("trtllm/launch.sh", script(base, "plain decoding: no speculative_config"))]
    _refuse("trtllm", result)
    ranges = batch_ranges(result)
    max_draft = c.num_speculative_tokens
    fields: dict = {}
    if ranges:
        first, top = ranges[0][2], max(n for _, _, n in ranges)
        if first != top:
            raise InputError(
                f"cannot export as trtllm: draft_len_schedule needs the N of its smallest batch size to be the "
                f"largest (= max_draft_len), but B={ranges[0][0]}..{ranges[0][1]} has N={first} and "
                f"{next(f'B={lo}..{hi}' for lo, hi, n in ranges if n == top)} has N={top}")
        max_draft = first
        fields["draft_len_schedule"] = {hi: n for _, hi, n in ranges}
    if c.is_ngram:  # per-request pool, newest match: what the engine's prompt lookup does
        spec = dict(decoding_type="NGram", max_draft_len=max_draft, max_matching_ngram_size=c.ngram_max,
                    is_use_oldest=False, is_public_pool=False, **fields)
    elif is_head(c):
        if ranges and c.tree:
            raise InputError("cannot export as trtllm: a draft_len_schedule with an EAGLE-3 tree was not read in "
                             "TensorRT-LLM's source (export the chain, or no per-batch-size N)")
        spec = dict(decoding_type="Eagle3", max_draft_len=max_draft, speculative_model=draft, **fields,
                    **trtllm_tree_fields(c))
    else:
        spec = dict(decoding_type="Draft_Target", max_draft_len=max_draft, speculative_model=draft, **fields)
    opts = _validated(sch.TrtllmExtraOptions, "trtllm", speculative_config=spec).model_dump(exclude_none=True)
    problems = check_trtllm_options(opts)  # TensorRT-LLM's own field names and types (_trtllm_fields)
    if problems:
        raise InputError(f"trtllm export fails TensorRT-LLM's fields at {TRTLLM_COMMIT[:8]}: {problems[0]}")
    text = f"# {SERVERS['trtllm'].version}\n" + yaml.safe_dump(opts, sort_keys=False)
    return [("trtllm/extra_llm_api_options.yaml", text),
            ("trtllm/launch.sh", options_script(base, "extra_llm_api_options.yaml", draft, SERVERS["trtllm"].version))]


def _llamacpp(result: TuningResult) -> Files:
    """Flags for the GGUF files written beside them (``target.gguf``, ``draft.gguf``: see ``_gguf``),
    named relative to the llamacpp folder; ``launch.sh`` runs from there. Flag names: llama.cpp
    0c1e57098's ``common/arg.cpp`` (llama-cpp-python 0.3.36), after the May 2026 ``--spec-*`` rename."""
    c = result.candidate
    target, draft = file_paths(result)
    base = ["llama-server", "-m", "target.gguf"]
    version = SERVERS["llamacpp"].version
    if c.is_plain:
        return [("llamacpp/launch.sh", _gguf_script(base, f"{version}; plain decoding: no --spec-* flags")),
                gguf_sources(target, None)]
    _refuse("llamacpp", result)
    n = c.num_speculative_tokens
    head = is_head(c)
    if c.is_ngram:
        args = _validated(sch.LlamacppSpeculativeArgs, "llamacpp", spec_type="ngram-simple",
                          spec_ngram_simple_size_n=c.ngram_max, spec_ngram_simple_size_m=n)
        legacy: list[str] = []
    else:
        # n-min 0: llama.cpp clears drafts shorter than n-min; the engine verifies every draft.
        args = _validated(sch.LlamacppSpeculativeArgs, "llamacpp", spec_type="draft-eagle3" if head else "draft-simple",
                          spec_draft_model="draft.gguf", spec_draft_n_max=n, spec_draft_n_min=0,
                          spec_draft_p_min=c.threshold)
        # Builds before the --spec-* rename had no EAGLE-3 draft type: no legacy flags for a head.
        legacy = [] if head else ["-md", "draft.gguf", "--draft-max", str(n), "--draft-min", "0", "--draft-p-min",
                                  f"{c.threshold:g}"]
    flags = args.flags()
    files = [("llamacpp/flags.txt", "\n".join(flags) + "\n"),
             ("llamacpp/launch.sh", _gguf_script(base + flags, version)), gguf_sources(target, draft, head=head)]
    if legacy:
        files.append(("llamacpp/flags-before-spec-rename.txt", "\n".join(legacy) + "\n"))
    return files


def _gguf_script(cmd: list[str], note: str) -> str:
    """A launch script that runs from its own folder, where the GGUF files are."""
    return (f"#!/bin/sh\n# {note}; the GGUF files are beside this script\ncd \"$(dirname \"$0\")\" || exit 1\n"
            "exec " + " ".join(shlex.quote(x) for x in cmd) + ' "$@"\n')


def _hf(result: TuningResult) -> Files:
    c = result.candidate
    if c.is_plain:
        return []
    _refuse("hf", result)
    if c.is_ngram:
        cfg = _validated(sch.HfPromptLookupGenerationConfig, "hf", prompt_lookup_num_tokens=c.num_speculative_tokens,
                         max_matching_ngram_size=c.ngram_max)
    else:
        # heuristic_transient restarts N every generate() call, as the engine restarts it every sequence.
        cfg = _validated(sch.HfAssistantGenerationConfig, "hf", num_assistant_tokens=c.num_speculative_tokens,
                         num_assistant_tokens_schedule="heuristic_transient" if c.schedule == "heuristic" else "constant",
                         assistant_confidence_threshold=c.threshold)
    return [("hf/generation_config.json", json.dumps(cfg.model_dump(), indent=2) + "\n")]


BUILDERS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "llamacpp": _llamacpp, "hf": _hf}


def ship(result: TuningResult, fmt: str, every: bool = True, model_root: str | None = None) -> Shipped:
    """What ``fmt``'s files carry (:func:`~._ship.carried`), built; with ``model_root`` the files name
    the models under it (:func:`~._paths.relocated`).

    Raises:
        InputError: the server cannot express the configuration (and nothing else was recorded), or
            a schema violation.
    """
    s = carried(result, fmt, every)
    moved = relocated(s.result, model_root)
    return replace(s, result=moved, files=_stated(BUILDERS[fmt](moved), moved, s.note is None))


def _stated(files: Files, result: TuningResult, winner: bool) -> Files:
    """Launch scripts say what they were tuned for (objective and SLO) in a comment; JSON, YAML and flag
    files take no comment their server would not reject, so the README states it for them."""
    from specdec_tune.tuner.servers._readme import tuned_for

    line = tuned_for(result, outcome=winner)
    if not line:
        return files
    out = []
    for path, text in files:
        if path.endswith(".sh") and text.startswith("#!/bin/sh\n"):
            text = text.replace("#!/bin/sh\n", f"#!/bin/sh\n# {line}\n", 1)
        out.append((path, text))
    return out


def ship_all(result: TuningResult, formats: Sequence[str],
             model_root: str | None = None) -> tuple[dict[str, Shipped], dict[str, str]]:
    """:func:`ship` every format asked: ``(shipped per format, refusal per skipped format)``.

    Named formats must all succeed; with ``all`` a format that cannot be written is skipped and its
    reason returned.

    Raises:
        InputError: an unknown format, or a named format that cannot be written.
    """
    fmts, every = resolve_formats(formats)
    shipped: dict[str, Shipped] = {}
    skipped: dict[str, str] = {}
    for f in fmts:
        try:
            shipped[f] = ship(result, f, every, model_root)
        except InputError as exc:
            if not every:
                raise
            skipped[f] = str(exc)
    return shipped, skipped


def build_exports(result: TuningResult,
                  formats: Sequence[str]) -> tuple[dict[str, Files], dict[str, str], dict[str, str]]:
    """Build (not write) every format: ``(files per format, refusal per skipped format, note per format
    whose files carry something other than the overall winner)`` (:func:`ship_all`).

    Raises:
        InputError: an unknown format, or a named format that cannot express the configuration.
    """
    shipped, skipped = ship_all(result, formats)
    return ({f: s.files for f, s in shipped.items()}, skipped,
            {f: s.note for f, s in shipped.items() if s.note is not None})


def vllm_config(target: str, c: Candidate, per_batch_size: dict[int, int] | None = None) -> Any:
    """The :class:`ServerConfig` vLLM runs for ``c``: the tuner's own vLLM export (so what is measured
    is what is exported), with the per-batch-size schedule when given."""
    from specdec_tune.profiler import ServerConfig

    if c.is_plain:
        return ServerConfig("plain", "none", 0, None)
    result = TuningResult(candidate=c, server="vllm", target=target, workload="", per_batch_size=per_batch_size or {})
    files, _, _ = build_exports(result, ["vllm"])
    spec = json.loads(dict(files["vllm"])["vllm/speculative_config.json"])
    label = c.label() + (" + schedule" if "num_speculative_tokens_per_batch_size" in spec else "")
    return ServerConfig(label, c.drafter, c.num_speculative_tokens, spec)
