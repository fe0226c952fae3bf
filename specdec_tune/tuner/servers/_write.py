"""Writing the exports: every format's files and the README, on disk or as one download.

Everything is built and validated first (:func:`~._exports.ship_all`; llama.cpp's GGUF files are
converted, ``_gguf``); only then is anything written, so a refusal or a schema violation leaves the
folder untouched. A format asked under ``all`` that cannot be written is not written and says why, in
the README's "Formats not written" and in :attr:`Written.not_written`, which ``tune`` and ``export``
print on that format's row.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import TuningResult
from specdec_tune.tuner.servers._exports import resolve_formats, ship_all
from specdec_tune.tuner.servers._gguf import bundled_ggufs, prepare_ggufs
from specdec_tune.tuner.servers._ship import Files

GGUF_DOWNLOAD_LIMIT = 256 * 2**20  # the most GGUF bytes one download carries (a browser download, held in memory)


@dataclass(frozen=True)
class Written:
    """What :func:`write_formats` wrote.

    Attributes:
        paths: format -> paths written (``"readme"`` -> the README).
        not_written: format asked but not written -> why (one line; the README lists the same).
        carries: format written -> the configuration its files carry (label).
    """

    paths: dict[str, list[Path]]
    not_written: dict[str, str]
    carries: dict[str, str]


def render_exports(result: TuningResult, formats: Sequence[str], model_root: str | None = None) -> dict[str, Files]:
    """Every text file :func:`write_exports` would write: format -> [(relative path, text)], plus
    ``"readme"`` -> ``[("README.md", text)]``. Nothing is written, and no GGUF file is converted.

    Raises:
        InputError: unknown format, a named format that cannot express the configuration, or a schema
            violation.
    """
    from specdec_tune.tuner.servers._readme import render_readme

    shipped, skipped = ship_all(result, formats, model_root)
    readme = render_readme(result, shipped, skipped, model_root)
    return {**{fmt: list(s.files) for fmt, s in shipped.items()}, "readme": [("README.md", readme)]}


def download_files(result: TuningResult, formats: Sequence[str] = ("all",),
                   gguf_limit: int = GGUF_DOWNLOAD_LIMIT) -> tuple[dict[str, dict[str, bytes]], dict[str, str]]:
    """Every file of the export as bytes, for one download (the dashboard's zip): ``(format -> relative
    path -> content, format not included -> why)``. llama.cpp's files come with their GGUF files when
    those are already converted on this machine and weigh at most ``gguf_limit`` together; otherwise
    llamacpp is left out (its flags would name files the download lacks) and the README says why.
    Nothing is converted or fetched here.

    Raises:
        InputError: as :func:`render_exports`.
    """
    from specdec_tune.tuner.servers._readme import render_readme

    shipped, skipped = ship_all(result, formats)
    built = {fmt: list(s.files) for fmt, s in shipped.items()}
    ggufs = bundled_ggufs(built, skipped, gguf_limit, result.study)  # may move llamacpp to skipped
    shipped = {fmt: s for fmt, s in shipped.items() if fmt in built}
    files = {fmt: {rel: text.encode("utf-8") for rel, text in group} for fmt, group in built.items()}
    for rel, src in ggufs.items():
        files["llamacpp"][rel] = src.read_bytes()
    files["readme"] = {"README.md": render_readme(result, shipped, skipped).encode("utf-8")}
    return files, skipped


def write_formats(result: TuningResult, formats: Sequence[str], out_dir: Path,
                  model_root: str | None = None) -> Written:
    """Write the files each format's server reads, and ``README.md``, under ``out_dir``; llama.cpp's
    GGUF files are converted from the models first (``_gguf``; the converter is fetched where missing).
    With ``model_root`` every file names the models under it, the serving host's folder (:mod:`._paths`);
    the conversion reads them here.

    Raises:
        InputError: unknown format, a named format that cannot express the configuration, a schema
            violation, or a named llamacpp whose GGUF files cannot be made; nothing is written then.
    """
    from specdec_tune.tuner.servers._readme import render_readme

    shipped, skipped = ship_all(result, formats)  # the models as they are here: what the conversion reads
    built = {fmt: list(s.files) for fmt, s in shipped.items()}
    ggufs = prepare_ggufs(built, skipped, resolve_formats(formats)[1])  # may move llamacpp to skipped
    if model_root:  # the same configurations, naming the serving host's copies
        shipped = ship_all(result, formats, model_root)[0]
        built = {fmt: list(s.files) for fmt, s in shipped.items() if fmt in built}
    shipped = {fmt: s for fmt, s in shipped.items() if fmt in built}
    rendered = {**built, "readme": [("README.md", render_readme(result, shipped, skipped, model_root))]}
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} exists and is not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[Path]] = {}
    for fmt, files in rendered.items():
        written[fmt] = []
        for rel, text in files:
            path = out_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if rel.endswith(".sh"):
                path.chmod(0o755)
            written[fmt].append(path)
    if ggufs:
        from specdec_tune.profiler import copy_gguf

        written["llamacpp"] += [copy_gguf(src, out_dir / rel) for rel, src in ggufs.items()]
    return Written(written, dict(skipped), {fmt: s.result.candidate.label() for fmt, s in shipped.items()})


def write_exports(result: TuningResult, formats: Sequence[str], out_dir: Path,
                  model_root: str | None = None) -> dict[str, list[Path]]:
    """:func:`write_formats`' paths: format -> paths written (``"readme"`` -> the README)."""
    return write_formats(result, formats, out_dir, model_root).paths
