"""The pre-router: request features, the fit on audits, and when it says predicted_reject."""

from __future__ import annotations

import json
import random
from pathlib import Path

from proxy.routing import prerouter
from proxy.routing.prerouter import PreRouter, fit, request_features

MATH = {"model": "m", "messages": [{"role": "user", "content": "What is 37 * 41?"}]}
FACT = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of Peru?"}]}


class Draws(random.Random):
    """An rng whose draws are given (the exploration coin)."""

    def __init__(self, *values: float) -> None:
        super().__init__()
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def write_model(tmp_path: Path, n: int = 200) -> Path:
    bodies = [MATH if i % 2 else FACT for i in range(n)]
    rows = [request_features(b) for b in bodies]
    model = fit(rows, [b is FACT for b in bodies])
    assert model is not None
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"prerouter": model.to_dict()}))
    return path


def test_request_features_read_the_kind_length_instructions_and_template() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Answer with only the number."},
            {"role": "user", "content": "What is 37 * 41?"},
        ],
        "response_format": {"type": "json_object"},
    }
    x = request_features(body)
    assert x["task_json"] == 1.0  # a JSON response_format makes it a json task
    assert x["req_system"] == 1.0 and x["req_format"] == 1.0 and x["req_instructions"] >= 1
    assert x["req_len_log"] > 0
    assert request_features(MATH)["req_template_id"] != x["req_template_id"]


def test_a_request_the_audits_say_is_rejected_goes_to_the_api(tmp_path: Path) -> None:
    path = write_model(tmp_path)
    router = PreRouter(str(path), enabled=True, rng=Draws(0.5, 0.5))
    assert router.predicted_reject(MATH) is True
    assert router.predicted_reject(FACT) is False
    assert router.health()["active"] is True


def test_an_exploration_share_still_tries_locally(tmp_path: Path) -> None:
    path = write_model(tmp_path)
    router = PreRouter(str(path), enabled=True, rng=Draws(prerouter.EXPLORE / 2))
    assert router.predicted_reject(MATH) is False


def test_it_never_acts_when_off_or_before_it_has_enough_audits(tmp_path: Path) -> None:
    path = write_model(tmp_path)
    assert PreRouter(str(path), enabled=False, rng=Draws(0.5)).predicted_reject(MATH) is False
    few = write_model(tmp_path, n=prerouter.MIN_AUDITS - 2)
    assert PreRouter(str(few), enabled=True, rng=Draws(0.5)).predicted_reject(MATH) is False
    missing = PreRouter(str(tmp_path / "none.json"), enabled=True, rng=Draws(0.5))
    assert missing.predicted_reject(MATH) is False


def test_a_corrupt_file_turns_it_off_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "weights.json"
    path.write_text('{"prerouter": {"features": ["task_math"]}}')
    router = PreRouter(str(path), enabled=True, rng=Draws(0.5))
    assert router.predicted_reject(MATH) is False
    assert router.health()["problem"] is not None


def test_no_fit_without_both_outcomes() -> None:
    rows = [request_features(MATH)] * 5
    assert fit(rows, [True] * 5) is None
