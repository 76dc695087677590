"""Agent turns: does an answer that follows a tool's result use it?

An agent framework (the Agents SDK, pydantic-ai, LangGraph...) sends the model the conversation
so far, runs the calls the answer makes, appends their results and asks again, until an answer
makes no call or a step limit is reached. An answer that makes again a call whose result is
already in the conversation gets the same result back, and the next answer is as likely to make
it a third time: the run ends only at the framework's step limit, as an error. The API's model
reads the result and answers from it, so a local answer that does not is a fault:

- ``tool_call_repeated`` (hard): a call identical (same name, same arguments as JSON) to one
  made since the user's last message whose result is in the conversation. A result that
  reports an error does not count: calling again after a failure can be right.
- ``tool_result_unused`` (hard): a text answer to the results that end the conversation that
  shares no word and no number with them (words compared by their first five letters, small
  words left out), as an answer that ignores what the tool said ("I cannot check the weather")
  does. It does not apply after an error, nor to results with nothing to compare.

Both checks are exact on what they read (the calls and results are in the request), which is
why they are hard rather than weighed; a fault sends the request to the API, which costs money
but never gives the client a worse answer. :func:`quality.turns.answered_calls` is also what
the engine reads to keep the local model from making such a call in the first place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from quality._types import Signal
from quality._view import View
from quality.turns import call_key, is_error

_NAME = "tool_use"

_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_WORD = re.compile(r"[^\W\d_]+")
_SMALL = frozenset(
    "the and for are was were with that this from has have had not but you your its our his her "
    "their them they there here what when where which who how why will would can could should "
    "into onto than then also just about been being over under more most some any all each "
    "result results call function tool".split()
)


def _stems(text: str) -> set[str]:
    """The numbers of ``text`` and the first five letters of its words that are not small."""
    text = text.casefold()
    words = {w[:5] for w in _WORD.findall(text) if len(w) >= 3 and w not in _SMALL}
    return words | set(_NUMBER.findall(text))


def _unused(content: str, results: Iterable[str]) -> bool:
    results = [r for r in results if r.strip()]
    if not results or any(is_error(r) for r in results):
        return False
    said = set().union(*(_stems(r) for r in results))
    return bool(said) and bool(content.strip()) and not (said & _stems(content))


def tool_use(view: View) -> Signal:
    if not view.answered_calls and not view.tool_results:
        return Signal(_NAME, applied=False)
    hard: list[str] = []
    if any(call_key(c.name, c.arguments) in view.answered_calls for c in view.tool_calls):
        hard.append("tool_call_repeated")
    if not view.tool_calls and _unused(view.content, view.tool_results):
        hard.append("tool_result_unused")
    return Signal(_NAME, applied=True, hard=tuple(hard))
