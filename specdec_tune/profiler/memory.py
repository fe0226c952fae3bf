"""Peak memory of one configuration, measured in a fresh process so that only its own memory counts.

On a GPU the number is ``torch.cuda.max_memory_allocated()`` over the decode (the peak statistics reset
once the models are loaded): every byte of it is a tensor of ours, so nothing else has to be
subtracted. On a CPU it is the resident set, which also holds the interpreter, torch, transformers,
the tokenizers and the compiled kernels (hundreds of MB, far more than the bundled models). To leave
only the configuration's own memory, the probe (``python -m specdec_tune.profiler.memory``):

1. warms up: loads the same models, decodes the same prompt once (every library, kernel and code path
   is loaded and stays loaded), then frees them, collects garbage and hands freed heap pages back to
   the system (glibc ``malloc_trim``);
2. reads the resident set: the *baseline*;
3. loads the models again, drops their tokenizers (a tokenizer is not what serving a sequence holds),
   trims again, resets the kernel's peak-RSS mark (``/proc/self/clear_refs`` with ``5``) and decodes;
4. reports the peak resident set during the decode (``VmHWM``) minus the baseline.

glibc's allocator keeps freed blocks below its (dynamic) mmap threshold in the heap, so on a CPU the
resident set also holds several MiB of slack that a long prefill's freed activations left behind
(measured here: plain decoding of a 459-token prompt peaked 57 MiB above the baseline with the
default allocator, 48.5 MiB with the fix below, against 50 MiB predicted). The probe therefore runs with
``MALLOC_MMAP_THRESHOLD_=65536`` and ``MALLOC_TRIM_THRESHOLD_=0`` (glibc ``mallopt`` tunables read from
the environment; a value set by the caller is kept): every tensor of 64 KiB or more is its own mapping,
returned to the system when freed, so the peak counts live memory, not the heap's slack.

The loading transient (file buffers, dtype conversion) is outside the window on purpose: serving
memory is what stays while sequences decode. Linux only on a CPU (``/proc``); elsewhere the probe
reports what it cannot measure instead of a number.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec_tune.core.errors import InputError


@dataclass(frozen=True)
class PeakMemory:
    """A configuration's own peak memory during one decode (bytes, measured).

    Attributes:
        bytes: peak minus baseline (CPU) or peak allocated (GPU).
        baseline_bytes: the resident set before the models were loaded (CPU; 0 on a GPU).
        peak_bytes: the resident set's peak during the decode (CPU) or the allocator's peak (GPU).
        method: how it was measured.
        prompt_tokens, new_tokens: the decode measured.
    """

    bytes: float
    baseline_bytes: float
    peak_bytes: float
    method: str
    prompt_tokens: int
    new_tokens: int
    label: str = "measured"


def measure_peak_memory(target: str, draft: str | None, num_speculative_tokens: int, prompt: str, *,
                        max_new_tokens: int, device: str = "cpu", dtype: str = "auto", forward: str = "auto",
                        threads: int = 1, timeout_s: float = 600.0) -> PeakMemory:
    """Run the probe in a fresh Python process (module docstring) and return what it measured.

    Args:
        target, draft: model names as ``load_model`` takes them (``draft`` None or ``none``: plain decoding,
            ``ngram``: prompt lookup).
        num_speculative_tokens: N (ignored for plain decoding).
        prompt: the prompt text.
        max_new_tokens: tokens to decode (the caches hold prompt + these + N + 2 positions).

    Raises:
        InputError: the probe failed (its last line of output says why).
    """
    args = {"target": target, "draft": draft, "n": int(num_speculative_tokens), "prompt": prompt,
            "max_new_tokens": int(max_new_tokens), "device": device, "dtype": dtype, "forward": forward,
            "threads": int(threads)}
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0",  # live memory, not heap slack
           **os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-m", "specdec_tune.profiler.memory", json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"the memory probe failed for {target} + {draft}: {tail}")
    return PeakMemory(**json.loads(lines[-1]))


def peak_for_run(run, draft: str, num_speculative_tokens: int, prompt: str, max_new_tokens: int,
                 threads: int) -> PeakMemory:
    """:func:`measure_peak_memory` of one configuration of a profile run, loaded as the run loaded it."""
    s = run.settings
    return measure_peak_memory(run.target.extra.get("source") or run.target.name,
                               "none" if num_speculative_tokens == 0 else draft, num_speculative_tokens, prompt,
                               max_new_tokens=max_new_tokens, device=s.device, dtype=s.dtype,
                               forward=s.forward, threads=threads)


# --------------------------------------------------------------------------- the probe (a fresh process)


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1]) * 1024  # kB
    raise OSError(f"/proc/self/status has no {field}")


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: freed pages stay with the allocator, the baseline is a little high
        pass


def _decode(args: dict, models: tuple) -> int:
    import torch

    from specdec_tune.core.speculative import SpeculativeConfig
    from specdec_tune.engine import DecodeConfig
    from specdec_tune.profiler.runs import DraftSpec, decode_once

    target, draft, ids = models
    # draft None or "none", or N = 0: plain decoding
    wanted = SpeculativeConfig.from_dict({"drafter": args["draft"] or "none", "num_speculative_tokens": args["n"]})
    free = wanted.drafter if wanted.is_ngram or wanted.is_suffix else None  # no model to load
    spec = DraftSpec("none") if wanted.is_plain else DraftSpec(free) if free else DraftSpec("model", draft)
    config = DecodeConfig(args["max_new_tokens"], None if wanted.is_plain else wanted)
    with torch.inference_mode():
        return len(decode_once(target, spec, ids, config).token_ids)


def _load(args: dict) -> tuple:
    from specdec_tune.engine import load_model
    from specdec_tune.profiler.runs import encode_prompt

    target = load_model(args["target"], args["device"], args["dtype"], args["forward"])
    ids = encode_prompt(target, args["prompt"])
    draft = None
    if args["draft"] not in (None, "none", "ngram", "suffix") and args["n"] > 0:
        draft = load_model(args["draft"], target.device, target.dtype, args["forward"])
        draft.tokenizer = None
    target.tokenizer = None
    return target, draft, ids


def _probe(args: dict) -> dict:
    import torch

    torch.set_num_threads(args["threads"])
    _decode(args, _load(args))  # warm-up: every library, kernel and code path loaded, then freed
    _trim()
    cuda = args["device"] == "cuda" or (args["device"] == "auto" and torch.cuda.is_available())
    baseline = 0.0 if cuda else _status("VmRSS")
    models = _load(args)
    _trim()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    new = _decode(args, models)
    peak = float(torch.cuda.max_memory_allocated()) if cuda else _status("VmHWM")
    return asdict(PeakMemory(peak - baseline, baseline, peak, "cuda max_memory_allocated" if cuda else
                             "VmHWM - VmRSS baseline (warmed up, malloc_trim, clear_refs, 64 KiB mmap threshold)",
                             int(models[2].shape[0]), new))


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(sys.argv[1]))), flush=True)
