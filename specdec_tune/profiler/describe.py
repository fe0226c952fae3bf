"""What a profile run stores about its inputs: hardware, models (with a tokenizer hash) and workload."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import torch

from specdec_tune.engine import LoadedModel
from specdec_tune.engine import resolve_workload


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def hardware_info(device: torch.device, monitor) -> dict:
    """Hardware row for the database: device model, memory, driver and library versions."""
    import transformers

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory = monitor.info.name or props.name, props.total_memory / 2**20
        count = torch.cuda.device_count()
    else:
        name, memory, count = _cpu_name(), _memory_mb(), 1
    return {
        "device": device.type, "device_name": name, "device_count": count, "memory_mb": memory,
        "driver_version": monitor.info.driver_version, "cuda_version": torch.version.cuda,
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "hostname": platform.node() or None,
        "extra": {"threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "python": platform.python_version()},
    }


def tokenizer_hash(tokenizer) -> str:
    """sha256 of the sorted vocabulary (token -> id): equal hashes mean interchangeable token ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def model_info(loaded: LoadedModel) -> dict:
    """Model row: name as given, size, dtype, vocabulary and tokenizer hash; the resolved source."""
    config = loaded.model.config.get_text_config(decoder=True)
    return {
        "name": loaded.name, "num_parameters": loaded.num_parameters, "num_layers": loaded.num_layers,
        "dtype": str(loaded.dtype).replace("torch.", ""), "vocab_size": int(config.vocab_size),
        "tokenizer_hash": tokenizer_hash(loaded.tokenizer), "extra": {"source": loaded.source},
    }


def workload_info(name: str, prompt_count: int) -> dict:
    """Workload row: name, sha256 of the file's content, number of prompts in it."""
    data = resolve_workload(name).read_bytes()
    return {"name": name, "content_hash": hashlib.sha256(data).hexdigest(), "prompt_count": prompt_count}
