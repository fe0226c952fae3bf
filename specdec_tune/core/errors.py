"""The project's exception hierarchy (one module, on purpose).

The CLI turns every :class:`SpecdecError` into one line on stderr and exit code 2.
"""
from __future__ import annotations


class SpecdecError(Exception):
    """Base class of every error the tool reports to a user."""


class InputError(SpecdecError, ValueError):
    """Bad user input: a flag, a prompt file, a config value."""


class ModelLoadError(SpecdecError):
    """A model or tokenizer could not be loaded, or a draft/target pair is incompatible."""


class StorageError(SpecdecError):
    """The results database could not be opened, read or written."""


class NotFoundError(SpecdecError, LookupError):
    """A named record (run id, bundled model, workload) does not exist."""


class BusyError(SpecdecError):
    """Another process is working on what this one needs (a tuning study): the message names it."""
