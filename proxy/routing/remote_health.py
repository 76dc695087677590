"""Whether a remote backend that answers answers *rightly*, per kind.

    listing_problem()   what is wrong with its model list (``GET {api_base}/models``), or None
    answer_problem()    what is wrong with a chat answer that parsed, or None

A server that answers with something other than its kind's JSON (a proxy's error page, another
service on that port), or whose model list lacks the configured ``model``, or whose answer was
made by another model, is marked down with the reason in ``/healthz`` (``error``), and probed
again with backoff like a server that does not answer. The model checks apply to the kinds whose
servers answer only for the models they list (``Kind.names_model``: vLLM, Ollama); llama-server
and llama-cpp-python answer with whatever model they loaded, whatever the request names.
"""

from __future__ import annotations

from typing import Any

import httpx

from proxy.routing.remote_kinds import Kind

__all__ = ["answer_problem", "listing_problem", "same_model"]


def same_model(a: str, b: str) -> bool:
    """Model names as one server spells them: Ollama's ``name`` is ``name:latest``."""
    return a.removesuffix(":latest") == b.removesuffix(":latest")


def listing_problem(kind: Kind, response: httpx.Response, model: str) -> str | None:
    """What is wrong with a 200 answer to ``GET {api_base}/models``, or None."""
    try:
        payload: Any = response.json()
    except ValueError:
        return "its model list is not JSON"
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return "its model list is not an OpenAI model list (no data array)"
    if not kind.names_model:
        return None
    ids = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")]
    if not any(same_model(i, model) for i in ids):
        listed = ", ".join(ids[:5]) or "none"
        return f"model {model!r} is not in its model list ({listed})"
    return None


def answer_problem(kind: Kind, completion: dict[str, Any], model: str) -> str | None:
    """What is wrong with an answer that parsed as a chat completion, or None."""
    answered = completion.get("model")
    if kind.names_model and isinstance(answered, str) and not same_model(answered, model):
        return f"it answered as model {answered[:80]!r}, not {model!r}"
    return None
