"""The checks of a ``/v1/responses`` body, run where the body is read (off the event loop when it
is large).

    checked(body, api_own)
                    the checks of :func:`proxy.protocol.validate.responses_request`, then the chat
                    check of what the cascade is asked (:func:`check_as_chat`: the schemas).
                    With the upstream's own Responses API as the fallback (``api_own(model)``),
                    what only it can do is let through (its own checks are the API's). A body
                    with ``item_reference`` items has only those checked: the rest is checked
                    once they are put in place (:meth:`ResponsesState.resolved`), by calling
                    this again; a ``background`` body is first held to its own rules
                    (:func:`background_checked`: stored)

Imports :mod:`proxy.upstream.responses_api` (what only the API can do), the protocol's
validate, responses_shapes and responses_translate modules, and this room's responses_state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.errors import BadRequest
from proxy.protocol.responses_shapes import asks
from proxy.protocol.responses_translate import check_as_chat, stand_in
from proxy.protocol.validate import responses_request
from proxy.serving.responses_state import check_references, references
from proxy.upstream.responses_api import API_ONLY


def checked(body: dict[str, Any], api_own: Callable[[Any], bool]) -> dict[str, Any]:
    """``body``, checked (see the module's docstring); raises ``BadRequest`` naming the
    parameter otherwise."""
    if isinstance(body, dict) and body.get("background") is True:
        background_checked(body)
    at = references(body)
    if at:
        check_references(body, at)
        return body
    if isinstance(body, dict) and api_own(body.get("model")):
        stand, taken = stand_in(body, API_ONLY)
        if taken:
            responses_request(stand)
            check_as_chat(stand)
            return body
        # an API-only parameter that asks for nothing (Codex's ``reasoning: {}``) is no
        # reason to refuse, nor to skip the local model; the API is still sent it
        kept = {k: v for k, v in body.items() if k not in API_ONLY or asks(v)}
        responses_request(kept)
        check_as_chat(stand_in(kept, API_ONLY)[0])
        return body
    responses_request(body)
    check_as_chat(stand_in(body, API_ONLY)[0])
    return body


def background_checked(body: dict[str, Any]) -> None:
    """A ``background`` request's own rule: it is stored (the client polls for it)."""
    if body.get("store") is False:
        raise BadRequest(
            "A background response must be stored: 'store' false cannot be used with "
            "'background' true.",
            param="store",
        )
