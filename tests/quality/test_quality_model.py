"""The gate on the real local model: the cache it is calibrated on is what the engine produces."""

from __future__ import annotations

from proxy.engine.generate import LocalModel, bundled_model_path
from quality import score
from quality.dev.devset import load
from quality.dev.local_answers import N_CTX, generate, load_answers, request_for, same_text


def test_regenerated_answers_match_the_cached_ones_and_score_with_confidence() -> None:
    prompts = [p for p in load() if p.id in ("factual-01", "arithmetic-03", "classification-13")]
    assert len(prompts) == 3
    model = LocalModel.load(bundled_model_path(), n_ctx=N_CTX, n_threads=2, seed=0)
    fresh = generate(prompts, model, verbose=False)
    cached = load_answers()
    for p in prompts:
        assert same_text(fresh[p.id], cached[p.id]), (
            f"{p.id}: the engine now answers differently from the cached answers the gate was "
            "calibrated on; run `python bench/gate_answers.py --split all` then "
            "`python -m quality.dev.fit_weights`"
        )
        s = score(request_for(p), fresh[p.id])
        assert "confidence" in s.signals
        assert 0.0 <= s.value <= 1.0
