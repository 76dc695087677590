"""The models in the Hugging Face cache, read from disk with no network.

The cache (``hub.cache_dir()``) holds one folder per repository, ``models--OWNER--NAME``:
``refs/main`` names a commit, ``snapshots/COMMIT/FILE`` links to ``blobs/ETAG``, and a file still
downloading is ``blobs/ETAG.incomplete`` with no link yet. For an LFS file (every GGUF) the ETag
is the content's SHA-256, which ``frugal models pull`` has checked, so a cached model's SHA-256
is read from its blob's name, not from gigabytes of hashing.

    find(name)                 the cached model for ``REPO:QUANT``, or None
    resolve(settings)          ``[local] model`` turned into ``model_path`` at start; a model
                               not in the cache is a ConfigError with the pull command to run
    cached()                   every GGUF model in the cache, one per quantization
    remove(model)              its links, and its blobs when no other link uses them
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from proxy.config import Settings
from proxy.config.model_name import ModelName
from proxy.errors import ConfigError
from proxy.models import ModelsError, files, hub

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class CachedModel:
    name: ModelName
    files: tuple[Path, ...]  # snapshot paths, split parts in order; llama.cpp opens the first
    size: int

    @property
    def path(self) -> Path:
        return self.files[0]

    def sha256(self) -> str:
        """The SHA-256 of the first file (what a weights file is tagged with)."""
        from quality.combiner import file_sha256

        return blob_sha256(self.path) or file_sha256(self.path)


def blob_sha256(path: str | Path) -> str | None:
    """The SHA-256 of a file in the hub cache, from its blob's name; None for another file."""
    blob = Path(os.path.realpath(path))
    if blob.parent.name == "blobs" and _SHA256.fullmatch(blob.name):
        return blob.name
    return None


def repo_folder(repo: str) -> Path:
    return hub.cache_dir() / ("models--" + repo.replace("/", "--"))


def _snapshot(repo: str) -> tuple[Path, list[files.RepoFile]] | None:
    """The snapshot ``main`` points at and its complete files, or None."""
    folder = repo_folder(repo)
    try:
        commit = (folder / "refs" / "main").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    snapshot = folder / "snapshots" / commit
    found: list[files.RepoFile] = []
    for root, _dirs, names in os.walk(snapshot):
        for n in names:
            full = Path(root) / n
            if full.is_file():  # a link whose blob is gone is not a file
                rel = full.relative_to(snapshot).as_posix()
                found.append(files.RepoFile(name=rel, size=full.stat().st_size))
    return snapshot, found


def find(name: ModelName) -> CachedModel | None:
    snap = _snapshot(name.repo)
    if snap is None:
        return None
    snapshot, present = snap
    try:
        chosen = files.pick(name.repo, present, name.quant)
    except ModelsError:
        return None
    return CachedModel(
        name=name, files=tuple(snapshot / f.name for f in chosen.files), size=chosen.size
    )


def cached() -> list[CachedModel]:
    out: list[CachedModel] = []
    root = hub.cache_dir()
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir()):
        if not folder.name.startswith("models--") or folder.name.count("--") != 2:
            continue
        repo = folder.name.removeprefix("models--").replace("--", "/")
        snap = _snapshot(repo)
        if snap is None:
            continue
        for quant in files.quants(snap[1]):
            model = find(ModelName(repo, quant))
            if model is not None:
                out.append(model)
    return out


def resolve(settings: Settings) -> Settings:
    """The settings with ``[local] model_path`` set to the cached file ``[local] model`` names.

    Reads the disk only: a model not pulled yet is refused with the command that pulls it,
    never downloaded here (a start must not hang on the network). Settings without ``model``,
    or already resolved, come back as they are.
    """
    local = settings.local
    if not local.model or local.model_path:
        return settings
    name = ModelName.parse(local.model)
    model = find(name)
    if model is None:
        raise ConfigError(
            f'[local] model = "{local.model}" is not in the Hugging Face cache '
            f"({hub.cache_dir()}): run `frugal models pull {name}` first (frugal serve never "
            "downloads a model at start)"
        )
    return dataclasses.replace(
        settings, local=dataclasses.replace(local, model_path=str(model.path))
    )


def remove(model: CachedModel) -> list[Path]:
    """Delete the model's links and the blobs they point at (unless another link uses one).
    The files removed, blobs first."""
    folder = repo_folder(model.name.repo)
    blobs = {Path(os.path.realpath(p)) for p in model.files}
    removed: list[Path] = []
    for link in model.files:
        link.unlink(missing_ok=True)
    still_used = {
        Path(os.path.realpath(p))
        for p in (folder / "snapshots").rglob("*")
        if p.is_symlink() or p.is_file()
    }
    for blob in sorted(blobs - still_used):
        if blob.is_relative_to(folder):  # never outside the repository's own folder
            blob.unlink(missing_ok=True)
            removed.append(blob)
    removed.extend(model.files)
    if not any((folder / "snapshots").rglob("*.gguf")):
        shutil.rmtree(folder, ignore_errors=True)  # nothing of it left to serve
    return removed
