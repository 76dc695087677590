"""The Hugging Face hub, through ``huggingface_hub``: the only module that calls it.

    list_files(repo)             the repository's commit and files, with sizes and LFS SHA-256s
    download(repo, name, size, check)  one file into the cache (a progress bar; resumed after
                                 a cut, even by a later call; never more than the ``size``
                                 listed, never from another host, failed when it stalls); its
                                 path in the snapshot
    endpoint(), cache_dir(), offline()    read from the environment when called

The environment is read at each call, not when ``huggingface_hub`` was imported, so a test (or a
shell) that sets ``HF_ENDPOINT`` or ``HF_HUB_CACHE`` gets what it set. ``HF_TOKEN`` (for gated
and private repositories) is passed to the hub and never written anywhere: an error message is
scrubbed of it before it leaves this module, and it is never logged. Every failure of the hub
client becomes :class:`~proxy.models.ModelsError` here, with a sentence for the user.

A hub is trusted with nothing it has not listed: the bytes of a file stop at the size its
listing gave (the size the memory fit was checked on), a redirect may only go to the hub's
own host (or huggingface.co's CDN), and a transfer that stalls or drips ends the pull. The
names a hub gives are written through :func:`proxy.logs.shown` in every message and progress
bar, so a name cannot send a terminal escape.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urljoin, urlsplit

from proxy.logs import shown
from proxy.models import ModelsError, UntrustedDownload
from proxy.models.files import RepoFile

DEFAULT_ENDPOINT = "https://huggingface.co"
CDN_DOMAINS = (".huggingface.co", ".hf.co")  # where huggingface.co sends its files' bytes
STALL_S = 60.0
"""Default of ``frugal models pull --stall-timeout``: a download that brings less than
:data:`PROGRESS_BYTES` in this many seconds has stalled, and the pull fails."""
PROGRESS_BYTES = 64 * 1024
RESUMES = 5  # a cut connection is resumed this many times within one pull
_COMMIT = re.compile(r"[0-9a-f]{40}")
MAX_HOPS = 5  # redirects on the hub's own host (a renamed repository) followed for a listing
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


def list_files(repo: str, *, stall_s: float = STALL_S) -> tuple[str, list[RepoFile]]:
    """The commit ``main`` points at, and every file of the repository (``stall_s``: the
    longest wait for a byte of the answer)."""
    from huggingface_hub import ModelInfo
    from huggingface_hub.utils import (  # type: ignore[attr-defined]  # lazily exported
        build_hf_headers,
        hf_raise_for_status,
    )

    base = endpoint()
    url = f"{base}/api/models/{repo}"
    try:
        session = _session()
        for _hop in range(MAX_HOPS):
            # Asked as HfApi.model_info(files_metadata=True) asks, but without following a
            # redirect blindly: the hub's client follows one to any host.
            answer = session.get(
                url,
                headers=build_hf_headers(token=_token()),
                params={"blobs": True},
                follow_redirects=False,
                timeout=stall_s,
            )
            if not answer.has_redirect_location:
                break
            target = urljoin(url, answer.headers["location"])
            if not _may_fetch_from(target, base, cdn=False):
                raise ModelsError(
                    f"{base} sent the listing of {repo} to another host "
                    f"({shown(urlsplit(target).netloc)}): refused; a pull asks the hub's own "
                    "host only"
                )
            url = target
        else:
            raise ModelsError(f"{base} redirected the listing of {repo} {MAX_HOPS} times")
        hf_raise_for_status(answer)
        info = ModelInfo(**answer.json())  # type: ignore[no-untyped-call]
        files = [
            RepoFile(
                name=str(s.rfilename),
                size=int(s.lfs.size if s.lfs is not None else s.size or 0),
                sha256=str(s.lfs.sha256) if s.lfs is not None else None,
            )
            for s in info.siblings or ()
        ]
    except ModelsError:
        raise
    except Exception as exc:  # noqa: BLE001 - every hub failure is translated, once, here
        raise _translate(exc, repo) from None
    return str(info.sha or "main"), files


def download(
    repo: str,
    name: str,
    size: int,
    check: Callable[[Path], None],
    *,
    stall_s: float = STALL_S,
) -> Path:
    """Fetch ``name`` of ``repo`` into the cache, or find it there; its path in the snapshot.

    ``size`` is what the repository's listing says (what the fit was checked on): the file's
    own metadata must say the same, and no more bytes than that are ever written. The bytes go
    to ``blobs/ETAG.incomplete`` in the repository's cache folder, which is kept when the
    transfer is cut: the next call goes on from where it stopped (a ``Range`` request), and a
    cut within one call is resumed a few times (:data:`RESUMES`). ``hf_hub_download`` alone
    would not: its partial file is unique to one call and deleted when the call fails. What a
    hub sends beyond its listing, or from another host, is refused (:func:`_fetch`). ``check``
    sees the whole file before it becomes the cache's blob (it deletes the file and raises
    when the bytes are wrong); then the snapshot's link and ``refs/main`` are made as the hub
    client's cache has them (:func:`_link`), with no second request that a hub could answer
    differently.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import (  # type: ignore[attr-defined]  # lazily exported
        WeakFileLock,
        build_hf_headers,
    )

    base, token = endpoint(), _token()
    label = shown(name)
    try:
        _session()
        url = hf_hub_url(repo, name, revision="main", endpoint=base)
        meta = get_hf_file_metadata(url, token=token, endpoint=base, timeout=stall_s)
        if not meta.etag or "/" in meta.etag or meta.etag.startswith("."):
            raise ModelsError(f"{base} gave no usable ETag for {repo}/{label}")
        if meta.size is not None and meta.size != size:
            raise ModelsError(
                f"{base} listed {label} at {size} bytes, and its file says {meta.size}: "
                "refused before any byte was downloaded"
            )
        if not _may_fetch_from(meta.location, base):
            raise ModelsError(
                f"{base} sent the download of {label} to another host "
                f"({shown(urlsplit(meta.location).netloc)}): refused; a pull fetches from the "
                "hub's own host (and, from huggingface.co, its CDN) only"
            )
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
                try:
                    with partial.open("r+b") as f:
                        _fetch(meta.location, f, size, headers, stall_s=stall_s, label=label)
                except UntrustedDownload:
                    partial.unlink(missing_ok=True)
                    raise
                check(partial)
                os.replace(partial, blob)
            path = _link(folder, meta.commit_hash or "", name, blob, base)
    except ModelsError:
        raise
    except Exception as exc:  # noqa: BLE001 - every hub failure is translated, once, here
        raise _translate(exc, repo) from None
    return Path(path)


def _session() -> Any:
    """The hub client's shared HTTP session, made to follow no redirect on its own: it would
    follow one to any host, loopback included (its own requests too, such as the registry it
    fetches to name the caller in its User-Agent). The redirects a pull takes are chosen here."""
    from huggingface_hub.utils import get_session  # type: ignore[attr-defined]

    session = get_session()
    session.follow_redirects = False
    return session


def _link(folder: Path, commit: str, name: str, blob: Path, base: str) -> Path:
    """``snapshots/COMMIT/NAME``, a relative link to ``blob``, and ``refs/main`` = COMMIT: the
    hub client's cache layout. A commit that is not 40 hex digits, or a name with an empty,
    ``.`` or ``..`` part, would leave the cache folder: refused."""
    parts = name.split("/")
    if not _COMMIT.fullmatch(commit) or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise ModelsError(
            f"{base} gave an unusable commit ({shown(commit) or 'none'}) or file name "
            f"({shown(name)}) for a cache path"
        )
    link = folder.joinpath("snapshots", commit, *parts)
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, link.parent)
    if not (link.is_symlink() and os.readlink(link) == target):
        link.unlink(missing_ok=True)
        os.symlink(target, link)
    refs = folder / "refs" / "main"
    refs.parent.mkdir(parents=True, exist_ok=True)
    refs.write_text(commit, encoding="utf-8")
    return link


def _may_fetch_from(location: str, base: str, *, cdn: bool = True) -> bool:
    """Whether ``location`` may be asked: the hub's own scheme, host and port, or (with
    ``cdn``, for huggingface.co) an HTTPS host of its own domains, where it keeps its CDN."""
    there, hub = urlsplit(location), urlsplit(base)
    if (there.scheme, there.netloc) == (hub.scheme, hub.netloc):
        return True
    host = (there.hostname or "").lower()
    return (
        cdn
        and base == DEFAULT_ENDPOINT
        and there.scheme == "https"
        and there.port is None
        and host.endswith(CDN_DOMAINS)
    )


def _fetch(
    url: str,
    into: BinaryIO,
    size: int,
    headers: dict[str, str],
    *,
    stall_s: float,
    label: str,
) -> None:
    """Append ``url``'s bytes to ``into``, from its end on, until it holds ``size`` bytes.

    Never more: a hub that sends past ``size`` (a ``Content-Length`` that says so, or bytes that
    keep coming) gets :class:`UntrustedDownload`, as does a redirect (the location was checked
    before; a second hop is not followed). A window of ``stall_s`` seconds that brings less than
    :data:`PROGRESS_BYTES` (a silent hub, or one that drips a byte at a time) ends the pull with
    a ModelsError; a cut connection is resumed from where it stopped, :data:`RESUMES` times."""
    import httpx
    from huggingface_hub.utils import tqdm  # type: ignore[attr-defined]  # lazily exported

    pos = into.seek(0, os.SEEK_END)
    if pos > size:
        raise UntrustedDownload(
            f"the partial download of {label} holds more than the {size} bytes listed; deleted"
        )
    ask = {**headers, "Accept-Encoding": "identity"}
    resumes = 0
    with (
        httpx.Client(follow_redirects=False, timeout=httpx.Timeout(stall_s)) as client,
        tqdm(desc=label, total=size, initial=pos, unit="B", unit_scale=True) as bar,  # type: ignore[no-untyped-call]
    ):
        while pos < size:
            if pos:
                ask["Range"] = f"bytes={pos}-"
            try:
                pos = _fetch_once(client, url, into, pos, size, ask, stall_s, label, bar)
            except httpx.TimeoutException:
                raise _stalled(label, stall_s, into.tell(), size) from None
            except (httpx.RemoteProtocolError, httpx.ReadError):
                if resumes == RESUMES:
                    raise
                resumes += 1  # a cut: ask for the rest
                pos = into.tell()


def _fetch_once(
    client: Any,
    url: str,
    into: BinaryIO,
    pos: int,
    size: int,
    ask: dict[str, str],
    stall_s: float,
    label: str,
    bar: Any,
) -> int:
    """One GET from ``pos`` on: the bytes written to ``into``; where it stopped."""
    with client.stream("GET", url, headers=ask) as answer:
        status = answer.status_code
        if answer.is_redirect:
            where = shown(urlsplit(answer.headers.get("location", "")).netloc or "?")
            raise UntrustedDownload(
                f"the download of {label} was redirected again (HTTP {status}, to {where}): refused"
            )
        if status >= 400:
            raise ModelsError(f"{endpoint()} answered {status} for {label}")
        if pos and status != 206:  # the range was not honoured: start again from the top
            into.seek(0)
            into.truncate()
            pos = 0
        length = answer.headers.get("content-length", "")
        if length.isdigit() and pos + int(length) > size:
            raise _overrun(label, size)
        mark, since = pos, time.monotonic()
        for chunk in answer.iter_raw():  # each read as it comes, not gathered into big chunks
            room = size - pos
            into.write(chunk[:room])
            bar.update(min(len(chunk), room))
            pos += min(len(chunk), room)
            if len(chunk) > room:
                raise _overrun(label, size)
            if pos - mark >= PROGRESS_BYTES:
                mark, since = pos, time.monotonic()
            elif time.monotonic() - since > stall_s:
                raise _stalled(label, stall_s, pos, size)
    return pos


def _overrun(label: str, size: int) -> UntrustedDownload:
    return UntrustedDownload(
        f"the hub sent more of {label} than the {size} bytes it listed: refused, and what came "
        "was deleted"
    )


def _stalled(label: str, stall_s: float, pos: int, size: int) -> ModelsError:
    return ModelsError(
        f"the download of {label} stalled: less than {PROGRESS_BYTES // 1024} KiB in "
        f"{stall_s:g} s, at byte {pos} of {size}; what came is kept, and the next pull goes "
        "on from there (--stall-timeout sets the wait)"
    )


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
    return ModelsError(shown(text.replace(token, "<HF_TOKEN>") if token else text))


def _is_network(exc: BaseException) -> bool:
    module: Any = type(exc).__module__ or ""
    return module.split(".")[0] in ("httpx", "httpx2", "httpcore", "h11", "ssl", "socket")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
