"""The judge protocol: one chat request to any OpenAI-compatible model, one verdict back.

This is a public interface, written down in ``docs/audit.md``; change it only with that file.

* The request is a chat completion for the judge model with two messages: a system message that
  says what *correct* means under ``correctness`` (:data:`SYSTEM_MESSAGES`), and a last user
  message that is a single JSON object ``{"request": <the client's messages>,
  "reference": "<API answer>", "candidate": "<local answer>"}``.
* Its ``response_format`` is the JSON schema ``frugal_verdict`` (:data:`RESPONSE_FORMAT`).
* The answer's message content is a JSON object with a boolean ``correct`` and an optional
  string ``reason``.

Anything else is no verdict: a transport that raises (a 5xx, a refused connection), a judge
slower than ``timeout_s``, an answer that is not that object. An audit without a verdict is
counted as failed and never as correct.

The transport is any ``async (body) -> dict`` that sends the body to the judge and returns the
decoded chat completion, raising on an HTTP error; in the proxy it is the upstream client.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

Transport = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

SCHEMA_NAME = "frugal_verdict"
RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": SCHEMA_NAME,
        "schema": {
            "type": "object",
            "properties": {"correct": {"type": "boolean"}, "reason": {"type": "string"}},
            "required": ["correct"],
        },
    },
}

_COMMON = (
    "You grade answers. The user message is a JSON object with three keys: `request`, the "
    "messages a client sent to a chat model; `reference`, an answer to that request from a "
    "strong model; `candidate`, another answer to the same request. Decide whether the "
    "candidate is correct. The reference is usually right but not always: judge the candidate "
    "against the request, using the reference as evidence. "
)
SYSTEM_MESSAGES: dict[str, str] = {
    "strict": _COMMON
    + "Correct means: the candidate is as right as the reference in content AND it follows "
    "every explicit instruction of the request about form: the format asked for (JSON, a "
    "list, a single word, a label from the given options), the length, and requests such as "
    '"only the number" or "no explanation". Right content in the wrong form is NOT correct. '
    'Answer with a JSON object: {"correct": true or false, "reason": "one short sentence"}.',
    "content": _COMMON
    + "Correct means: the candidate is as right as the reference in content, in any form. "
    "Ignore wording, length, formatting and extra explanation, as long as what the candidate "
    "asserts is right and answers the request. A wrong, missing or contradictory answer is "
    'NOT correct. Answer with a JSON object: {"correct": true or false, "reason": "one short '
    'sentence"}.',
}

_FENCED = re.compile(r"\s*```(?:json)?\s*\n?(.*?)\n?```\s*", re.S)
_MAX_REASON_CHARS = 500
JUDGE_MAX_TOKENS = 300
"""The judge's answer is one short JSON object (a verdict and a sentence of reason, at most
500 characters kept): this bounds what the call can cost, so that its worst case can be held
against the client key's budget before it is made."""


def judge_body(
    *,
    model: str,
    messages: Sequence[dict[str, Any]],
    reference: str,
    candidate: str,
    correctness: str,
) -> dict[str, Any]:
    """The chat completion request that asks ``model`` to judge ``candidate``."""
    if correctness not in SYSTEM_MESSAGES:
        raise ValueError(f"unknown correctness {correctness!r}")
    case = {"request": list(messages), "reference": reference, "candidate": candidate}
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_MESSAGES[correctness]},
            {"role": "user", "content": json.dumps(case, ensure_ascii=False)},
        ],
        "response_format": RESPONSE_FORMAT,
        "max_tokens": JUDGE_MAX_TOKENS,
        "stream": False,
    }


@dataclass(frozen=True, kw_only=True)
class JudgeOutcome:
    """What one judge call gave. ``correct`` is None when there is no verdict; ``error`` then
    says why: ``timeout``, ``transport`` (the call raised: a 5xx, a refused connection) or
    ``garbage`` (the answer is not the protocol's object). ``reason`` is the judge's own
    words: content, stored only when content logging is on."""

    correct: bool | None
    reason: str = ""
    error: str | None = None
    error_type: str = ""  # the exception's class name, for the log (never its text)
    usage: dict[str, Any] | None = None  # the judge's usage block, to price the call

    @property
    def failed(self) -> bool:
        return self.correct is None


def read_verdict(response: Any) -> tuple[bool, str] | None:
    """``(correct, reason)`` from a judge's chat completion, or None when it does not follow
    the protocol. A JSON object wrapped in one code fence is read too; nothing else is."""
    try:
        content = response["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(content, str):
        return None
    fenced = _FENCED.fullmatch(content)
    try:
        verdict = json.loads(fenced.group(1) if fenced else content)
    except (ValueError, RecursionError):
        return None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("correct"), bool):
        return None
    reason = verdict.get("reason", "")
    reason = reason[:_MAX_REASON_CHARS] if isinstance(reason, str) else ""
    return verdict["correct"], reason


def _usage(response: Any) -> dict[str, Any] | None:
    usage = response.get("usage") if isinstance(response, dict) else None
    return usage if isinstance(usage, dict) else None


async def ask_judge(
    transport: Transport, body: dict[str, Any], *, timeout_s: float = 60.0
) -> JudgeOutcome:
    """Send ``body`` through ``transport`` and read the verdict. Never raises for a failed
    judge (only cancellation goes through): every failure is an outcome without a verdict."""
    try:
        response = await asyncio.wait_for(transport(body), timeout=timeout_s)
    except TimeoutError:
        return JudgeOutcome(correct=None, error="timeout", error_type="TimeoutError")
    except Exception as exc:  # noqa: BLE001 (any transport failure is "no verdict")
        return JudgeOutcome(correct=None, error="transport", error_type=type(exc).__name__)
    verdict = read_verdict(response)
    if verdict is None:
        return JudgeOutcome(correct=None, error="garbage", usage=_usage(response))
    correct, reason = verdict
    return JudgeOutcome(correct=correct, reason=reason, usage=_usage(response))
