"""``frugal models pull REPO[:QUANT]``: one GGUF from Hugging Face, checked, into the cache.

1. list the repository's files (sizes and LFS SHA-256s, from the hub's metadata);
2. pick the quantization's file, or all the parts of a split one (``files.pick``);
3. say its size and whether it fits this machine (``fit``), and stop there when it does
   not, unless ``--force``: nothing has been downloaded yet;
4. download each file (``hub.download``: a progress bar, resumed after a cut, never more
   bytes than the listing said, failed after ``stall_s`` without progress);
5. hash each file and compare with the hub's SHA-256: ``hf_hub_download`` keeps whatever
   bytes arrived under the name the hub announced, so this is the only check they get. A
   file that does not match is deleted, and the pull fails saying so;
6. check the fit again on the bytes actually on disk (a blob already in the cache was never
   bounded by this listing), unless ``--force``;
7. print the config lines that serve it, and those that calibrate the gate for it.

File names come from the hub: they are printed through :func:`proxy.logs.shown`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from proxy.config import LocalSettings
from proxy.config.model_name import ModelName
from proxy.engine import memory
from proxy.logs import shown
from proxy.models import ModelsError, files, fit, hub

GB = 1e9


@dataclass(frozen=True)
class Pulled:
    name: ModelName
    files: tuple[Path, ...]
    size: int
    sha256: str  # of the first file
    plan: memory.MemoryPlan


def pull(
    name: ModelName,
    local: LocalSettings,
    *,
    force: bool = False,
    available: tuple[int | None, str] | None = None,
    stall_s: float = hub.STALL_S,
    out: TextIO,
) -> Pulled:
    """Pull ``name``; progress and the fit go to ``out``. Raises ModelsError."""
    if hub.offline():
        raise ModelsError(
            "HF_HUB_OFFLINE is set: pulling needs the network; unset it to pull "
            "(`frugal models list` shows what the cache holds)"
        )
    _commit, listing = hub.list_files(name.repo, stall_s=stall_s)
    chosen = files.pick(name.repo, listing, name.quant)
    names = ", ".join(shown(f.name) for f in chosen.files)
    print(f"{name}: {names} ({chosen.size / GB:.2f} GB)", file=out)
    p = fit.plan(chosen.size, local, available=available)
    print(f"memory: {fit.line(p)}", file=out)
    if not p.fits:
        tip = _advice(p, local)
        if not force:
            raise ModelsError(
                f"{name} does not fit this machine's memory; nothing was downloaded. To fix: "
                f"{tip}; or pull it anyway with --force"
            )
        print(f"memory: --force: pulling {name} though it does not fit", file=out)
    paths: list[Path] = []
    sha = ""
    for f in chosen.files:
        digests: list[str] = []

        def check(path: Path, f: files.RepoFile = f, digests: list[str] = digests) -> None:
            print(f"verifying {shown(f.name)} (SHA-256)", file=out)
            digests.append(verify(path, f))

        paths.append(hub.download(name.repo, f.name, f.size, check, stall_s=stall_s))
        sha = sha or (digests[0] if digests else "")
    fetched = sum(path.stat().st_size for path in paths)
    if fetched != chosen.size:
        p = fit.plan(fetched, local, available=available)
        print(f"memory: the files hold {fetched} bytes, not {chosen.size}: {fit.line(p)}", file=out)
        if not p.fits and not force:
            raise ModelsError(
                f"{name}: its files in the cache hold {fetched / GB:.2f} GB, not the "
                f"{chosen.size / GB:.2f} GB the hub listed, and that does not fit this "
                f"machine's memory. To fix: {_advice(p, local)}; or keep it with --force"
            )
    return Pulled(name=name, files=tuple(paths), size=fetched, sha256=sha, plan=p)


def _advice(p: memory.MemoryPlan, local: LocalSettings) -> str:
    return memory.advice(
        p, has_draft=local.speculative == "draft", prefix_cache_mb=local.prefix_cache_mb
    )


def verify(path: Path, expected: files.RepoFile) -> str:
    """The file's SHA-256 when it is the hub's; else delete the file and raise ModelsError."""
    from quality.combiner import file_sha256

    if not expected.sha256:
        path.unlink(missing_ok=True)
        raise ModelsError(
            f"{shown(expected.name)}: the hub gives no SHA-256 for it (not an LFS file), so it "
            "cannot be checked; it was deleted"
        )
    actual = file_sha256(path)
    if actual != expected.sha256.lower():
        path.unlink(missing_ok=True)
        raise ModelsError(
            f"{shown(expected.name)}: its SHA-256 is {actual}, the hub says "
            f"{shown(expected.sha256)}: the download is corrupt and was deleted; run the pull again"
        )
    return actual


def next_steps(pulled: Pulled) -> str:
    """The config lines that serve the model, and those that calibrate the gate for it."""
    return f"""# frugal.toml: serve {pulled.name} (in place of [local] model_path)
[local]
model = "{pulled.name}"

# The quality gate uses the shipped prior, fitted to SmolLM2, until it is calibrated for this
# model. To calibrate it from the model's own audits (they need a [fallback] API):
[audit]
rate = 0.05
[quality]
weights_path = "frugal-weights.json"
auto_calibrate = true"""
