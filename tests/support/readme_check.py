"""Read an export folder twice, independently: the server files as each server reads them, and the
README's section for each server; say where they disagree.

The file readers follow each server's own reading (vLLM's inclusive ranges, TensorRT-LLM's upper-bound
keys, SGLang's num_draft_tokens = steps + 1, llama.cpp's and HF's flag names), not the exporter's code,
so a README rendered from other values than the files were built from is caught.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

TITLES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "llamacpp": "llama.cpp",
          "hf": "HF transformers"}


def _pairs(path: Path) -> dict[str, str]:
    lines = path.read_text().split("\n")[:-1]
    return dict(zip(lines[::2], lines[1::2]))


def _vllm(d: Path) -> dict:
    f = d / "speculative_config.json"
    if not f.exists():
        return {"plain": True}
    cfg = json.loads(f.read_text())
    ranges = cfg.get("num_speculative_tokens_per_batch_size")
    n1 = next((k for lo, hi, k in ranges if lo <= 1 <= hi), None) if ranges else cfg["num_speculative_tokens"]
    per_b = {b: k for lo, hi, k in ranges for b in range(lo, hi + 1)} if ranges else None
    return {"plain": False, "n": n1, "theta": 0.0, "schedule": "constant", "per_b": per_b,
            "draft": "ngram" if cfg["method"] == "ngram" else cfg["model"]}


def _trtllm(d: Path) -> dict:
    f = d / "extra_llm_api_options.yaml"
    if not f.exists():
        return {"plain": True}
    spec = yaml.safe_load(f.read_text())["speculative_config"]
    sched = spec.get("draft_len_schedule")
    per_b = None
    if sched:  # upper-bound keys: batch size B takes the first key >= B
        per_b = {b: sched[min(k for k in sched if k >= b)] for b in range(1, max(sched) + 1)}
    return {"plain": False, "n": per_b[1] if per_b else spec["max_draft_len"], "theta": 0.0, "schedule": "constant",
            "per_b": per_b, "draft": "ngram" if spec["decoding_type"] == "NGram" else spec["speculative_model"]}


def _sglang(d: Path) -> dict:
    f = d / "flags.txt"
    if not f.exists():
        return {"plain": True}
    flags = _pairs(f)
    ngram = flags["--speculative-algorithm"] == "NGRAM"
    return {"plain": False, "n": int(flags["--speculative-num-draft-tokens"]) - 1, "theta": 0.0,
            "schedule": "constant", "draft": "ngram" if ngram else flags["--speculative-draft-model-path"]}


def _llamacpp(d: Path) -> dict:
    f = d / "flags.txt"
    if not f.exists():
        return {"plain": True}
    flags = _pairs(f)
    if flags["--spec-type"] == "ngram-simple":
        return {"plain": False, "n": int(flags["--spec-ngram-simple-size-m"]), "theta": 0.0, "schedule": "constant",
                "draft": "ngram"}
    draft = flags["--spec-draft-model"]
    sources = d / "gguf_sources.json"  # the GGUF file beside the flags names the model it was converted from
    if sources.exists() and draft in (doc := json.loads(sources.read_text())):
        draft = doc[draft]["model"]
    return {"plain": False, "n": int(flags["--spec-draft-n-max"]), "theta": float(flags["--spec-draft-p-min"]),
            "schedule": "constant", "draft": draft}


def _hf(d: Path) -> dict:
    f = d / "generation_config.json"
    if not f.exists():
        return {"plain": True}
    cfg = json.loads(f.read_text())
    if "prompt_lookup_num_tokens" in cfg:
        return {"plain": False, "n": cfg["prompt_lookup_num_tokens"], "theta": 0.0, "schedule": "constant",
                "draft": "ngram"}
    return {"plain": False, "n": cfg["num_assistant_tokens"], "theta": cfg["assistant_confidence_threshold"],
            "schedule": "heuristic" if cfg["num_assistant_tokens_schedule"].startswith("heuristic") else "constant",
            "draft": None}  # HF takes the assistant model in code, not in the file


READERS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "llamacpp": _llamacpp, "hf": _hf}


def read_files(out: Path) -> dict[str, dict]:
    """Server -> what its files say (only servers with a folder)."""
    return {s: READERS[s](out / s) for s in READERS if (out / s).is_dir()}


def readme_section(text: str, server: str) -> str:
    """The README's section for ``server`` (from its ``###`` heading to the next heading)."""
    m = re.search(rf"^### {re.escape(TITLES[server])} \(.*?(?=^##)", text + "\n## end", re.M | re.S)
    assert m, f"the README has no section for {server}"
    return m.group(0)


def read_readme(text: str, server: str) -> dict:
    """What the README's section says the server's files carry."""
    sec = readme_section(text, server)
    label = re.search(r"^- configuration: \*\*(.+?)\*\*", sec, re.M).group(1)
    if label == "plain decoding":
        return {"plain": True}
    n = int(re.search(r"^- N \(num_speculative_tokens\): (\d+)", sec, re.M).group(1))
    theta = float(re.search(r"^- θ: ([0-9.]+)", sec, re.M).group(1))
    schedule = re.search(r"^- schedule: (\w+)", sec, re.M).group(1)
    drafter = re.search(r"^- drafter: `([^`]+)`(?: \(path `([^`]+)`\))?", sec, re.M)
    draft = "ngram" if drafter.group(1) == "ngram" else (drafter.group(2) or drafter.group(1))
    points = re.search(r"^- N per batch size \(.*?\): (.+)$", sec, re.M)
    per_b = {int(b): int(k) for b, k in re.findall(r"B=(\d+): (\d+)", points.group(1))} if points else None
    return {"plain": False, "n": n, "theta": theta, "schedule": schedule, "per_b": per_b, "draft": draft}


def mismatches(out: Path) -> list[str]:
    """Every disagreement between each server's files and its README section (empty: they agree)."""
    text = (out / "README.md").read_text()
    bad = []
    for server, reader in READERS.items():
        if not re.search(rf"^### {re.escape(TITLES[server])} \(", text, re.M):
            if (out / server).is_dir():
                bad.append(f"{server}: files written, but the README has no section for them")
            continue
        f, r = reader(out / server), read_readme(text, server)  # no file at all (HF's plain decoding) is plain
        if f["plain"] or r["plain"]:
            if f["plain"] != r["plain"]:
                bad.append(f"{server}: files plain={f['plain']}, README plain={r['plain']}")
            continue
        for key in ("n", "theta", "schedule"):
            if f[key] != r[key]:
                bad.append(f"{server}: {key} is {f[key]!r} in the files, {r[key]!r} in the README")
        if f["draft"] is not None and f["draft"] != r["draft"]:
            bad.append(f"{server}: draft {f['draft']!r} in the files, {r['draft']!r} in the README")
        if r["per_b"]:  # the README's per-batch-size N at each batch size it names, as the server reads the file
            if server not in ("vllm", "trtllm"):
                bad.append(f"{server}: the README gives a per-batch-size N the server cannot take")
            for b, k in r["per_b"].items():
                got = f["per_b"].get(b) if f.get("per_b") else f["n"]
                if got != k:
                    bad.append(f"{server}: B={b} takes N={got} in the files, {k} in the README")
        elif f.get("per_b"):
            bad.append(f"{server}: a per-batch-size N in the files that the README does not give")
    return bad
