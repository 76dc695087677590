"""``frugal models pull | list | rm`` against a stand-in hub on loopback (``HF_ENDPOINT``).

The real CLI and the real ``huggingface_hub`` client, over real HTTP, fetch real GGUF files:
the bundled SmolLM2 (Q4_1), the relevance signal's all-MiniLM-L6-v2 (Q8_0), and that file cut
into two parts named as a split GGUF. Nothing of the hub client is mocked; the faults (a cut
connection, an outage, a flipped byte, a 40 GB listing) are the server's.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.config import LocalSettings, from_dict
from proxy.config.model_name import ModelName
from proxy.engine.generate import bundled_model_path
from proxy.models import ModelsError, fit, pull
from quality.relevance import gguf_path
from tests.loopback import in_terminal
from tests.models.conftest import (
    GATED,
    GATED_TOKEN,
    HUGE,
    MINI,
    MINI_FILE,
    SMOL,
    SMOL_FILE,
    SPLIT,
    SPLIT_FILES,
    GiB,
)
from tests.models.hub_server import COMMIT, StandInHub


def _cache(tmp_path: Path, repo: str) -> Path:
    return tmp_path / "hf-cache" / ("models--" + repo.replace("/", "--"))


def _listed(capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, object]]:
    capsys.readouterr()
    assert main(["models", "list", "--format", "json", *extra]) == 0
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return rows


def test_pull_list_and_rm_a_real_gguf(
    hub: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "pull", f"{SMOL}:Q4_1"]) == 0
    out, err = capsys.readouterr()
    size = Path(bundled_model_path()).stat().st_size
    assert f"{SMOL}:Q4_1: {SMOL_FILE} ({size / 1e9:.2f} GB)" in err
    assert "memory: fits: about " in err and "n_ctx=4096, parallel 4" in err
    printed = from_dict(tomllib.loads(out), source="the pull's output")  # pasteable
    assert printed.local.model == f"{SMOL}:Q4_1"  # the line that serves it
    assert printed.audit.rate > 0 and printed.quality.auto_calibrate  # those that calibrate it
    assert printed.quality.weights_path == "frugal-weights.json"
    pulled = _cache(tmp_path, SMOL) / "snapshots" / COMMIT / SMOL_FILE
    assert pulled.read_bytes() == Path(bundled_model_path()).read_bytes()
    assert hub.served[SMOL_FILE] == size  # once, whole

    rows = _listed(capsys)
    assert rows == [
        {
            "name": f"{SMOL}:Q4_1",
            "repo": SMOL,
            "quant": "Q4_1",
            "size_bytes": size,
            "path": str(pulled),
            "files": 1,
            "in_use": False,
            "calibrated": False,
            "gate": "the gate uses the shipped prior, fitted to SmolLM2 (not calibrated for this "
            "model yet; [quality] weights_path is not set)",
            "sha256": hub.repos[SMOL][SMOL_FILE].sha256,
        }
    ]
    config = tmp_path / "frugal.toml"
    config.write_text(f'[local]\nmodel = "{SMOL}:Q4_1"\n', encoding="utf-8")
    assert _listed(capsys)[0]["in_use"] is True
    assert main(["models", "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "QUANT", "SIZE", "IN", "USE", "GATE", "PATH"]
    assert table[1].split()[:4] == [SMOL, "Q4_1", f"{size / 1e9:.2f}", "GB"]

    hub.requests.clear()
    assert main(["models", "pull", f"{SMOL}:q4_1"]) == 0  # in the cache: nothing fetched again
    assert hub.gets(SMOL_FILE) == []

    assert main(["models", "rm", f"{SMOL}:Q4_1"]) == 1  # the config serves it
    assert "frugal serve would refuse to start without it" in capsys.readouterr().err
    config.unlink()
    assert main(["models", "rm", f"{SMOL}:Q4_1"]) == 0
    assert not _cache(tmp_path, SMOL).exists()
    assert _listed(capsys) == []


def test_a_split_gguf_is_pulled_in_full(
    hub: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "pull", f"{SPLIT}:Q8_0"]) == 0
    assert all(hub.served[name] > 0 for name in SPLIT_FILES)
    snapshot = _cache(tmp_path, SPLIT) / "snapshots" / COMMIT
    joined = b"".join((snapshot / name).read_bytes() for name in SPLIT_FILES)
    assert joined == gguf_path().read_bytes()
    (row,) = _listed(capsys)
    assert row["files"] == 2 and row["size_bytes"] == len(joined)
    assert row["path"] == str(snapshot / SPLIT_FILES[0])  # llama.cpp opens the first part
    assert main(["models", "rm", f"{SPLIT}:Q8_0"]) == 0  # every part, and their blobs
    assert not _cache(tmp_path, SPLIT).exists()
    assert _listed(capsys) == []


def test_the_pull_shows_a_progress_bar_in_a_terminal(hub: StandInHub, tmp_path: Path) -> None:
    """The real ``frugal models pull`` in a pseudo-terminal, as a user at a shell runs it: the hub
    client's bar counts the file's bytes up to 100% (it draws none into a pipe or a log)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    status, shown = in_terminal(
        [sys.executable, "-m", "proxy", "models", "pull", f"{MINI}:Q8_0"],
        env=env,
        cwd=tmp_path,
        columns=100,
    )
    assert status == 0, shown.decode(errors="replace")
    text = shown.decode(errors="replace")
    size = hub.repos[MINI][MINI_FILE].size
    assert f"{MINI_FILE}: 100%|" in text
    assert f"{size / 1e6:.1f}M/{size / 1e6:.1f}M" in text  # every byte counted
    assert hub.served[MINI_FILE] == size


def test_a_cut_download_is_resumed_by_the_next_pull(
    hub: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    size = hub.repos[MINI][MINI_FILE].size
    half = size // 2
    hub.cut_at[MINI_FILE] = half
    hub.down_after_cut = True  # the connection drops, and the hub stays away
    assert main(["models", "pull", f"{MINI}:Q8_0"]) == 1
    err = capsys.readouterr().err
    assert "frugal models: " in err and "answered 503" in err
    sha = hub.repos[MINI][MINI_FILE].sha256
    partial = _cache(tmp_path, MINI) / "blobs" / f"{sha}.incomplete"
    # What was written before the cut is kept, up to the cut (it then asked for the rest once,
    # and got a 503).
    kept = partial.stat().st_size
    assert 0 < kept <= half
    assert [g.range for g in hub.gets(MINI_FILE)] == [None, f"bytes={kept}-"]

    hub.reset()  # the hub is back
    assert main(["models", "pull", f"{MINI}:Q8_0"]) == 0
    (get,) = hub.gets(MINI_FILE)
    assert get.range == f"bytes={kept}-"
    assert hub.served[MINI_FILE] == size - kept  # only the rest came
    blob = _cache(tmp_path, MINI) / "blobs" / sha
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == sha
    assert not partial.exists()


def test_a_cut_within_one_pull_is_resumed_by_the_hub_client(
    hub: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    size = hub.repos[MINI][MINI_FILE].size
    cut = size * 2 // 3
    hub.cut_at[MINI_FILE] = cut
    assert main(["models", "pull", f"{MINI}:Q8_0"]) == 0
    first, second = hub.gets(MINI_FILE)
    assert first.range is None and second.range is not None
    kept = int(second.range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < kept <= cut  # the whole chunks written before the cut
    assert hub.served[MINI_FILE] == cut + (size - kept)
    blob = _cache(tmp_path, MINI) / "blobs" / hub.repos[MINI][MINI_FILE].sha256
    assert blob.read_bytes() == gguf_path().read_bytes()


def test_a_flipped_byte_is_refused_and_deleted(
    hub: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.flip_at[MINI_FILE] = 12_345
    assert main(["models", "pull", f"{MINI}:Q8_0"]) == 1
    err = capsys.readouterr().err
    sha = hub.repos[MINI][MINI_FILE].sha256
    assert f"the hub says {sha}: the download is corrupt and was deleted" in err
    blobs = _cache(tmp_path, MINI) / "blobs"
    assert [p.name for p in blobs.iterdir()] == []  # neither the blob nor a partial file
    assert _listed(capsys) == []


def test_a_quant_that_is_not_there_lists_those_that_are(
    hub: StandInHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "pull", SMOL]) == 1  # Q4_K_M by default
    err = capsys.readouterr().err
    assert f"frugal models: {SMOL} has no Q4_K_M GGUF; the quantizations there: Q4_1" in err
    assert hub.gets(SMOL_FILE) == []


def test_a_model_too_big_is_refused_before_any_byte(hub: StandInHub) -> None:
    vps = (8 * GiB, "an 8 GB VPS")
    with pytest.raises(ModelsError) as refused:
        pull.pull(ModelName.parse(HUGE), LocalSettings(), available=vps, out=_Sink())
    assert "does not fit this machine's memory; nothing was downloaded" in str(refused.value)
    assert "--force" in str(refused.value)
    assert [r.path for r in hub.requests] == [f"/api/models/{HUGE}"]  # the listing only
    assert hub.served == {}


def test_force_pulls_a_model_that_does_not_fit(hub: StandInHub) -> None:
    sink = _Sink()
    tiny = (16 << 20, "a 16 MiB test box")
    pulled = pull.pull(ModelName.parse(f"{MINI}:Q8_0"), LocalSettings(), force=True,
                       available=tiny, out=sink)  # fmt: skip
    assert "memory: does not fit: " in sink.text and "--force: pulling" in sink.text
    assert pulled.files[0].read_bytes() == gguf_path().read_bytes()


def test_the_fit_line_counts_the_kv_cache_of_every_sequence(hub: StandInHub) -> None:
    sink = _Sink()
    pull.pull(ModelName.parse(f"{MINI}:Q8_0"), LocalSettings(parallel=2), out=sink)
    assert "parallel 2" in sink.text and "batch_kv_cache" in sink.text


def test_the_fit_line_says_the_headroom_the_guard_s_estimate_leaves(hub: StandInHub) -> None:
    local = LocalSettings()
    needed = fit.plan(hub.repos[MINI][MINI_FILE].size, local, available=(1 << 40, "t")).estimate
    room = needed.total + 300 * (1 << 20)  # the estimate, and 300 MiB more
    sink = _Sink()
    pull.pull(ModelName.parse(f"{MINI}:Q8_0"), local, available=(room, "a test box"), out=sink)
    assert f"memory: fits: about {needed.total / (1 << 20):.0f} MiB at n_ctx=4096, " in sink.text
    assert "available " in sink.text and "; headroom about 300 MiB" in sink.text


def test_a_pull_asks_for_each_file_once(hub: StandInHub, tmp_path: Path) -> None:
    """The listing, then one HEAD and one GET per part, and nothing more: no second look at a
    file after its bytes are checked, which a hub could answer with another ETag (and the hub
    client would then fetch it again, with no bound of ours)."""
    pull.pull(ModelName.parse(f"{SPLIT}:Q8_0"), LocalSettings(), out=_Sink())
    asked = [
        (r.method, r.path.rsplit("/", 1)[-1])
        for r in hub.requests
        if r.path.startswith("/api/models/") or "/resolve/" in r.path
    ]  # not the hub client's own daily /api/agent-harnesses
    assert asked == [
        ("GET", SPLIT.rsplit("/", 1)[-1]),
        *[(m, n) for n in SPLIT_FILES for m in ("HEAD", "GET")],
    ]
    snapshot = _cache(tmp_path, SPLIT) / "snapshots" / COMMIT
    assert (_cache(tmp_path, SPLIT) / "refs" / "main").read_text() == COMMIT
    assert all((snapshot / n).is_symlink() for n in SPLIT_FILES)


def test_the_fit_is_checked_again_on_the_bytes_in_the_cache(hub: StandInHub) -> None:
    """A blob already in the cache is not bounded by a new listing: a hub that now lists the
    same file (same SHA-256) at 1 MB has it judged by its real size, which does not fit."""
    pull.pull(ModelName.parse(f"{MINI}:Q8_0"), LocalSettings(), out=_Sink())  # the real file
    entry = hub.repos[MINI][MINI_FILE]
    real = entry.size
    hub.repos[MINI][MINI_FILE] = type(entry)(entry.path, 10**6, entry.sha256)
    try:
        local = LocalSettings(memory_guard="refuse")  # no shrinking to make it fit
        room = fit.plan(10**6, local, available=(1 << 40, "t")).estimate.total
        box = (room + (1 << 20), "a box with room for the listed 1 MB only")
        sink = _Sink()
        with pytest.raises(ModelsError) as refused:
            pull.pull(ModelName.parse(f"{MINI}:Q8_0"), local, available=box, out=sink)
        assert f"its files in the cache hold {real / 1e9:.2f} GB, not the 0.00 GB" in str(
            refused.value
        )
        assert "memory: fits: " in sink.text and f"the files hold {real} bytes" in sink.text
    finally:
        hub.repos[MINI][MINI_FILE] = entry


@pytest.mark.parametrize(
    "name",
    ["../etc/passwd", "owner/name/extra", "owner/..", "owner/na..me", "owner/name;rm -rf ~",
     "owner/$(id)", "owner/name:Q4 K", "owner--x/name", "/name", "owner/name:"],
)  # fmt: skip
def test_bad_names_are_a_clear_error_before_any_request(
    hub: StandInHub, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "pull", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"frugal models: model name {name!r}: ")
    assert hub.requests == []


def test_no_such_repository_and_the_token_stays_secret(
    hub: StandInHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "hf_0123456789secretSECRETsecret"
    monkeypatch.setenv("HF_TOKEN", secret)
    assert main(["models", "pull", "test-org/Nothing-GGUF"]) == 1
    out, err = capsys.readouterr()
    assert "no repository test-org/Nothing-GGUF on " in err and "set HF_TOKEN" in err
    assert secret not in out + err
    assert hub.requests[0].authorization == f"Bearer {secret}"  # it was sent, to the hub only


def test_a_gated_repository_needs_hf_token_and_is_pulled_with_it(
    hub: StandInHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["models", "pull", f"{GATED}:Q8_0"]) == 1  # no token
    err = capsys.readouterr().err
    assert f"frugal models: {GATED} on {hub.url} is gated: accept its terms on the hub, " in err
    assert "then set HF_TOKEN to a token that may read it" in err
    assert hub.served == {}

    monkeypatch.setenv("HF_TOKEN", "hf_aTokenThatMayNotReadIt000000")
    assert main(["models", "pull", f"{GATED}:Q8_0"]) == 1
    out, err = capsys.readouterr()
    assert "is gated: accept its terms" in err and "hf_aTokenThatMayNot" not in out + err

    monkeypatch.setenv("HF_TOKEN", GATED_TOKEN)
    hub.requests.clear()
    assert main(["models", "pull", f"{GATED}:Q8_0"]) == 0
    out, err = capsys.readouterr()
    assert GATED_TOKEN not in out + err
    files = [r for r in hub.requests if "/resolve/" in r.path]
    assert files and all(r.authorization == f"Bearer {GATED_TOKEN}" for r in files)
    blob = _cache(tmp_path, GATED) / "blobs" / hub.repos[GATED][MINI_FILE].sha256
    assert blob.read_bytes() == gguf_path().read_bytes()


def test_pull_refuses_offline_mode(
    hub: StandInHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", "pull", f"{MINI}:Q8_0"]) == 1
    assert "HF_HUB_OFFLINE is set: pulling needs the network" in capsys.readouterr().err
    assert hub.requests == []


class _Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass
