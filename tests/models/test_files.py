"""Which files hold a quantization (``proxy/models/files.py``), and a split model's size."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from proxy.engine.gguf import read_header
from proxy.models import ModelsError
from proxy.models.files import RepoFile, pick, quant_of


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Qwen2.5-7B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("Meta-Llama-3.1-8B-Instruct-IQ4_XS.gguf", "IQ4_XS"),
        ("Q8_0/Llama-3.1-70B-Q8_0-00001-of-00002.gguf", "Q8_0"),
        ("gemma-2-9b-it-BF16.gguf", "BF16"),
        ("mmproj-model-f16.gguf", None),  # a projector, not a model
        ("README.md", None),
        ("Qwen2-7B.gguf", None),  # no quantization in its name
    ],
)
def test_the_quant_is_read_from_the_file_name(name: str, quant: str | None) -> None:
    assert quant_of(name) == quant


def test_every_part_of_a_split_model_is_picked_in_order() -> None:
    files = [
        RepoFile("m-Q8_0-00002-of-00002.gguf", 2),
        RepoFile("m-Q4_K_M.gguf", 5),
        RepoFile("m-Q8_0-00001-of-00002.gguf", 3),
    ]
    chosen = pick("o/m", files, "q8_0")
    assert [f.name for f in chosen.files] == [files[2].name, files[0].name]
    assert chosen.size == 5
    with pytest.raises(ModelsError, match="split in 2 parts, and only parts 1 are there"):
        pick("o/m", files[1:], "Q8_0")


def test_a_split_model_header_counts_the_weights_of_every_part(tmp_path: Path) -> None:
    key = b"split.count"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    header += struct.pack("<Q", len(key)) + key + struct.pack("<IH", 2, 2)  # uint16 2
    first = tmp_path / "m-Q8_0-00001-of-00002.gguf"
    first.write_bytes(header + b"\0" * 1000)
    (tmp_path / "m-Q8_0-00002-of-00002.gguf").write_bytes(b"\0" * 5000)
    assert read_header(str(first)).file_size == len(header) + 1000 + 5000
