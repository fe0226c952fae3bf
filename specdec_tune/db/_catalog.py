"""Register hardware, models and workloads: one row per distinct description.

A row is found by the SHA-256 of its canonical JSON values (``fingerprint``), so registering the same
machine, model or prompt set twice returns the first row's id, also when two processes race.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from specdec_tune.db import _models as m
from specdec_tune.db._connection import Database
from specdec_tune.db._session import session_scope
from specdec_tune.core.errors import InputError

_HARDWARE_KEYS = (
    "device", "device_name", "device_count", "memory_mb", "driver_version", "cuda_version",
    "torch_version", "transformers_version", "hostname", "extra",
)  # fmt: skip
_MODEL_KEYS = (
    "name", "revision", "num_parameters", "num_layers", "dtype", "vocab_size", "tokenizer_hash",
    "extra",
)  # fmt: skip
_WORKLOAD_KEYS = ("name", "content_hash", "prompt_count")


def _fingerprint(values: Mapping[str, Any]) -> str:
    canonical = json.dumps(values, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _checked(
    info: Mapping[str, Any], keys: Sequence[str], required: Sequence[str], what: str
) -> dict:
    unknown = sorted(set(info) - set(keys))
    if unknown:
        raise InputError(f"unknown {what} field(s) {unknown}; valid: {', '.join(keys)}")
    missing = [k for k in required if info.get(k) in (None, "")]
    if missing:
        raise InputError(f"{what} info needs {', '.join(missing)} (got {dict(info)!r})")
    values = {k: info.get(k) for k in keys}
    if "extra" in values:
        values["extra"] = dict(values["extra"] or {})
    return values


def _get_or_create(db: Database, cls: type[m.Base], values: dict[str, Any]) -> int:
    fingerprint = _fingerprint(values)
    query = select(cls.id).where(cls.fingerprint == fingerprint)  # type: ignore[attr-defined]
    with session_scope(db, write=True) as s:
        existing = s.scalar(query)
        if existing is not None:
            return existing
        row = cls(fingerprint=fingerprint, **values)
        try:
            with s.begin_nested():  # another process may insert the same row concurrently
                s.add(row)
        except IntegrityError:
            found = s.scalar(query)
            if found is None:
                raise
            return found
        return row.id


def get_or_create_hardware(db: Database, info: Mapping[str, Any]) -> int:
    """Return the id of the hardware row equal to ``info``, inserting it if new.

    Args:
        db: An opened database.
        info: ``device`` ("cuda"/"cpu") and ``device_name`` (GPU or CPU model) are required;
            optional: device_count, memory_mb, driver_version, cuda_version, torch_version,
            transformers_version, hostname, extra (a JSON dict).
    """
    values = _checked(info, _HARDWARE_KEYS, ("device", "device_name"), "hardware")
    # Normalise numbers so that 8192 and 8192.0 do not give two rows for one machine.
    values["device_count"] = int(values["device_count"] or 1)
    if values["memory_mb"] is not None:
        values["memory_mb"] = float(values["memory_mb"])
    return _get_or_create(db, m.Hardware, values)


def get_or_create_model(db: Database, info: Mapping[str, Any]) -> int:
    """Return the id of the model equal to ``info`` (``name``: path or hub id), inserting it if new.

    Optional keys: revision, num_parameters, num_layers, dtype, vocab_size, tokenizer_hash, extra.
    A retrained model at the same path differs in parameters or tokenizer hash and gets a new row.
    """
    values = _checked(info, _MODEL_KEYS, ("name",), "model")
    for key in ("num_parameters", "num_layers", "vocab_size"):
        if values[key] is not None:
            values[key] = int(values[key])
    return _get_or_create(db, m.Model, values)


def get_or_create_workload(db: Database, info: Mapping[str, Any]) -> int:
    """Return the id of the workload with this ``name``, ``content_hash`` and ``prompt_count``."""
    values = _checked(info, _WORKLOAD_KEYS, _WORKLOAD_KEYS, "workload")
    values["prompt_count"] = int(values["prompt_count"])
    if values["prompt_count"] < 0:
        raise InputError(f"workload prompt_count must be >= 0, got {values['prompt_count']!r}")
    return _get_or_create(db, m.Workload, values)
