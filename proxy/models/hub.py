"""The Hugging Face hub, through ``huggingface_hub``: the only module that calls it.

    list_files(repo)             the repository's commit and files, with sizes and LFS SHA-256s
    download(repo, name, check)  one file into the cache (a progress bar; resumed after a
                                 cut, even by a later call); its path in the snapshot
    endpoint(), cache_dir(), offline()    read from the environment when called

The environment is read at each call, not when ``huggingface_hub`` was imported, so a test (or a
shell) that sets ``HF_ENDPOINT`` or ``HF_HUB_CACHE`` gets what it set. ``HF_TOKEN`` (for gated
and private repositories) is passed to the hub and never written anywhere: an error message is
scrubbed of it before it leaves this module, and it is never logged. Every failure of the hub
client becomes :class:`~proxy.models.ModelsError` here, with a sentence for the user.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from proxy.models import ModelsError
from proxy.models.files import RepoFile

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "on", "yes", "true"}


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def cache_dir() -> Path:
    """The hub's cache folder, as ``huggingface_hub`` finds it: ``$HF_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.path.expanduser(os.environ["HF_HUB_CACHE"])))
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None  # None: the token `hf auth login` stored, if any


def list_files(repo: str) -> tuple[str, list[RepoFile]]:
    """The commit ``main`` points at, and every file of the repository."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint(), token=_token()).model_info(repo, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - every hub failure is translated, once, here
        raise _translate(exc, repo) from None
    files = [
        RepoFile(
            name=s.rfilename,
            size=int(s.lfs.size if s.lfs is not None else s.size or 0),
            sha256=s.lfs.sha256 if s.lfs is not None else None,
        )
        for s in info.siblings or ()
    ]
    return str(info.sha or "main"), files


def download(repo: str, name: str, check: Callable[[Path], None]) -> Path:
    """Fetch ``name`` of ``repo`` into the cache, or find it there; its path in the snapshot.

    The bytes go to ``blobs/ETAG.incomplete`` in the repository's cache folder, which is kept
    when the transfer is cut: the next call goes on from where it stopped (a ``Range`` request).
    ``hf_hub_download`` alone would not: its partial file is unique to one call and deleted when
    the call fails. ``http_get`` (the hub client's own transfer: its headers, retries and
    progress bar) resumes a cut connection a few times within a call; this keeps what it got
    across calls too. ``check`` sees the whole file before it becomes the cache's blob (it
    deletes the file and raises when the bytes are wrong); ``hf_hub_download`` then finds the
    blob and makes the snapshot's link and ``refs/main`` as the cache has them.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import (  # type: ignore[attr-defined]  # lazily exported
        WeakFileLock,
        build_hf_headers,
    )

    base, token = endpoint(), _token()
    try:
        url = hf_hub_url(repo, name, revision="main", endpoint=base)
        meta = get_hf_file_metadata(url, token=token, endpoint=base)
        if not meta.etag or "/" in meta.etag or meta.etag.startswith("."):
            raise ModelsError(f"{base} gave no usable ETag for {repo}/{name}")
        folder = cache_dir() / ("models--" + repo.replace("/", "--"))
        blob = folder / "blobs" / meta.etag
        lock = cache_dir() / ".locks" / folder.name / f"{meta.etag}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        blob.parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(str(lock)):
            if blob.exists():
                check(blob)
            else:
                partial = blob.with_name(meta.etag + ".incomplete")
                partial.touch()
                headers = build_hf_headers(token=token)
                if urlsplit(meta.location).netloc != urlsplit(url).netloc:
                    headers.pop("authorization", None)  # a CDN: the token stays with the hub
                with partial.open("r+b") as f:
                    f.seek(0, os.SEEK_END)
                    http_get(
                        meta.location,
                        f,
                        resume_size=f.tell(),
                        headers=headers,
                        expected_size=meta.size,
                        displayed_filename=name.rsplit("/", 1)[-1],
                    )
                check(partial)
                os.replace(partial, blob)
        path = hf_hub_download(
            repo, name, revision="main", cache_dir=cache_dir(), endpoint=base, token=token
        )
    except ModelsError:
        raise
    except Exception as exc:  # noqa: BLE001 - every hub failure is translated, once, here
        raise _translate(exc, repo) from None
    return Path(path)


def _translate(exc: BaseException, repo: str) -> ModelsError:
    """One sentence for a failure of the hub client, with no token in it."""
    from huggingface_hub import errors

    where = endpoint()
    if isinstance(exc, errors.GatedRepoError):
        text = (
            f"{repo} on {where} is gated: accept its terms on the hub, then set HF_TOKEN to a "
            "token that may read it"
        )
    elif isinstance(exc, errors.RepositoryNotFoundError):
        text = (
            f"no repository {repo} on {where} (or it is private: set HF_TOKEN to a token that "
            "may read it)"
        )
    elif isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "no"
        text = f"{where} answered {status} for {repo}: {_first_line(exc)}"
    elif isinstance(exc, errors.OfflineModeIsEnabled):
        text = "HF_HUB_OFFLINE is set: pulling needs the network; unset it to pull"
    elif _is_network(exc):
        text = f"cannot reach {where} ({type(exc).__name__}: {_first_line(exc)})"
    elif isinstance(exc, OSError):
        text = f"the download of {repo} failed: {_first_line(exc)}"
    else:
        text = f"the hub client failed on {repo}: {type(exc).__name__}: {_first_line(exc)}"
    token = _token()
    return ModelsError(text.replace(token, "<HF_TOKEN>") if token else text)


def _is_network(exc: BaseException) -> bool:
    module: Any = type(exc).__module__ or ""
    return module.split(".")[0] in ("httpx", "httpx2", "httpcore", "h11", "ssl", "socket")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
