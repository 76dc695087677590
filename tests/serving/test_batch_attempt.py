"""A batch line's local attempt (proxy/serving/batch_attempt.py) on the real bundled engine, the
real router and its real quality gate: the batch's window is the deadline the engine is given
(not ``[local] timeout_s``), the engine is asked in its ``deferred`` class, a bad body is the
line's 400 naming the parameter, and what the local model cannot serve is said so without a
call to it. Which answers the gate keeps is the test's choice (``[quality.models]``: bar 0 for
``gpt-4o-mini``, 1 for ``gpt-4o``). The end to end path is tests/server/test_batch_serve.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.engine.local_engine import Ask, LocalEngine
from proxy.routing.router import Router
from proxy.serving.batch_attempt import BatchAttempt
from proxy.serving.batch_lines import Accepted, CannotServe, Rejected
from tests.conftest import settings_for
from tests.fake_api import FakeAPI

KEPT, REFUSED = "gpt-4o-mini", "gpt-4o"
QUESTION = "What is the capital of France?"
TIMEOUT_S = 0.5  # [local] timeout_s: far shorter than any line's window


@dataclass(eq=False)
class Seen:
    """The shared engine, with what each call asked of it noted (its :class:`Ask`, and the
    seconds to its deadline then); everything else is the engine's own."""

    _engine: LocalEngine
    asks: list[tuple[Ask, float]] = field(init=False, default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def answer(self, request: dict[str, Any], ask: Ask) -> dict[str, Any]:
        self.asks.append((ask, ask.deadline - time.monotonic()))
        return await self._engine.answer(request, ask)


def attempt_on(engine: LocalEngine, tmp_path: Path, api: FakeAPI) -> tuple[BatchAttempt, Seen]:
    settings = settings_for(
        tmp_path,
        api,
        local={"timeout_s": TIMEOUT_S, "n_threads": 1},
        quality={"models": {KEPT: 0.0, REFUSED: 1.0}},
        router={"predictive": False},
    )
    seen = Seen(engine)
    router = Router(settings, seen, fallback_enabled=True)  # type: ignore[arg-type]
    return BatchAttempt(router, default_max_tokens=16), seen


def chat(model: str, content: Any = QUESTION, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


async def test_a_line_gets_the_batch_window_as_deadline_in_the_deferred_class(
    engine: LocalEngine, tmp_path: Path, fake_api: FakeAPI
) -> None:
    attempt, seen = attempt_on(engine, tmp_path, fake_api)
    window = time.time() + 3600.0
    kept = await attempt("/v1/chat/completions", chat(KEPT), deadline=window, priority="deferred")
    refused = await attempt(
        "/v1/chat/completions", chat(REFUSED), deadline=window, priority="deferred"
    )
    print("asks", seen.asks)
    assert [ask.priority for ask, _ in seen.asks] == ["deferred", "deferred"]
    assert all(left > 3000.0 for _, left in seen.asks)  # the window, not [local] timeout_s
    assert isinstance(kept, Accepted) and kept.status_code == 200
    assert kept.body["object"] == "chat.completion" and kept.body["model"] == KEPT
    assert "frugal" not in kept.body and kept.usage is not None
    assert isinstance(refused, Rejected) and refused.reason == "low_quality"


async def test_legacy_and_responses_lines_are_answered_as_their_endpoints_answer(
    engine: LocalEngine, tmp_path: Path, fake_api: FakeAPI
) -> None:
    attempt, seen = attempt_on(engine, tmp_path, fake_api)
    window = time.time() + 3600.0
    text = await attempt(
        "/v1/completions",
        {"model": KEPT, "prompt": QUESTION, "max_tokens": 8},
        deadline=window,
        priority="deferred",
    )
    response = await attempt(
        "/v1/responses",
        {"model": KEPT, "input": QUESTION, "max_output_tokens": 16},
        deadline=window,
        priority="deferred",
    )
    assert isinstance(text, Accepted) and text.body["object"] == "text_completion"
    assert isinstance(response, Accepted) and response.body["object"] == "response"
    assert response.body["model"] == KEPT and response.body["output"]
    assert len(seen.asks) == 2


async def test_a_bad_body_is_the_lines_400_and_what_cannot_be_served_never_reaches_the_engine(
    engine: LocalEngine, tmp_path: Path, fake_api: FakeAPI
) -> None:
    attempt, seen = attempt_on(engine, tmp_path, fake_api)
    window = time.time() + 3600.0
    image = [
        {"type": "text", "text": QUESTION},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    answers = {
        "bad": await attempt(
            "/v1/chat/completions", chat(KEPT, temperature=7), deadline=window, priority="deferred"
        ),
        "image": await attempt(
            "/v1/chat/completions", chat(KEPT, image), deadline=window, priority="deferred"
        ),
        "search": await attempt(
            "/v1/chat/completions",
            chat(KEPT, web_search_options={}),
            deadline=window,
            priority="deferred",
        ),
        "responses tool": await attempt(
            "/v1/responses",
            {"model": KEPT, "input": QUESTION, "tools": [{"type": "web_search"}]},
            deadline=window,
            priority="deferred",
        ),
        "embeddings": await attempt(
            "/v1/embeddings",
            {"model": "text-embedding-3-small", "input": QUESTION},
            deadline=window,
            priority="deferred",
        ),
        "window over": await attempt(
            "/v1/chat/completions", chat(KEPT), deadline=time.time() - 1, priority="deferred"
        ),
    }
    print(answers)
    bad = answers.pop("bad")
    assert isinstance(bad, Accepted) and (bad.status_code, bad.reason) == (400, "bad_request")
    assert bad.body["error"]["param"] == "temperature"
    assert set(bad.body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(answers.pop("window over"), Rejected)
    assert all(isinstance(a, CannotServe) for a in answers.values()), answers
    assert seen.asks == []
