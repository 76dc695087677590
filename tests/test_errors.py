"""The error tree and its one renderer: every ProxyError's JSON, the same object in SSE, and the
500, 404 and 405 of an in-process app (the real RequestIdMiddleware and exception handlers)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from structlog.testing import capture_logs

import proxy.errors
from proxy.errors import (
    BadRequest,
    BudgetExhausted,
    BudgetUnavailable,
    CountUnavailable,
    Forbidden,
    InternalError,
    LocalUnavailable,
    MethodNotAllowed,
    MisdirectedRequest,
    ModelNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProxyError,
    RequestTimeout,
    StatusError,
    StoreFull,
    StoreUnavailable,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamStatus,
    UpstreamTimeout,
)
from proxy.server.app import RequestIdMiddleware
from proxy.server.render import exception_handlers, render, sse_event, unexpected

SECRET = "SECRET-PROMPT-text"


INVALID = "invalid_request_error"

# Each class: an instance of it.
CASES: dict[type[ProxyError], Callable[[], ProxyError]] = {
    BadRequest: lambda: BadRequest("bad n", param="n"),
    Unauthorized: lambda: Unauthorized("no key"),
    NotFound: lambda: NotFound("no such endpoint"),
    MethodNotAllowed: lambda: MethodNotAllowed("not here", headers={"allow": "POST"}),
    RequestTimeout: lambda: RequestTimeout("too slow"),
    PayloadTooLarge: lambda: PayloadTooLarge("too big"),
    UnsupportedMediaType: lambda: UnsupportedMediaType("send JSON"),
    MisdirectedRequest: lambda: MisdirectedRequest("wrong host"),
    TooManyRequests: lambda: TooManyRequests("busy"),
    ModelNotAllowed: lambda: ModelNotAllowed("not for this key", param="model"),
    Forbidden: lambda: Forbidden("an admin key reads this"),
    BudgetExhausted: lambda: BudgetExhausted("the budget is spent"),
    BudgetUnavailable: lambda: BudgetUnavailable("no budget database"),
    StoreUnavailable: lambda: StoreUnavailable("no responses database"),
    CountUnavailable: lambda: CountUnavailable("not counted in time"),
    StoreFull: lambda: StoreFull("this key keeps too much", param="store"),
    StatusError: lambda: StatusError(400, "malformed"),
    InternalError: lambda: InternalError("req-1"),
    LocalUnavailable: lambda: LocalUnavailable("no local answer"),
    UpstreamError: lambda: UpstreamError("API failed"),
    UpstreamTimeout: lambda: UpstreamTimeout("API too slow"),
    UpstreamRateLimited: lambda: UpstreamRateLimited("API busy", retry_after_s=2.5),
    UpstreamStatus: lambda: UpstreamStatus(
        400,
        {"error": {"message": "bad", "type": INVALID, "param": "x"}},
        "the upstream API refused the request (HTTP 400)",
    ),
}

# Each class: its status and its JSON body's message, type, code and param.
BODIES: dict[type[ProxyError], tuple[int, str, str, str | None, str | None]] = {
    BadRequest: (400, "bad n", INVALID, "invalid_value", "n"),
    Unauthorized: (401, "no key", "authentication_error", "invalid_api_key", None),
    NotFound: (404, "no such endpoint", INVALID, "not_found", None),
    MethodNotAllowed: (405, "not here", INVALID, "method_not_allowed", None),
    RequestTimeout: (408, "too slow", INVALID, "request_timeout", None),
    PayloadTooLarge: (413, "too big", INVALID, "request_too_large", None),
    UnsupportedMediaType: (415, "send JSON", INVALID, "unsupported_media_type", None),
    MisdirectedRequest: (421, "wrong host", INVALID, "misdirected_request", None),
    TooManyRequests: (429, "busy", "requests", "rate_limit_exceeded", None),
    ModelNotAllowed: (403, "not for this key", INVALID, "model_not_allowed", "model"),
    Forbidden: (403, "an admin key reads this", INVALID, "permission_denied", None),
    BudgetExhausted: (429, "the budget is spent", "insufficient_quota", "insufficient_quota", None),
    BudgetUnavailable: (503, "no budget database", "server_error", "budget_unavailable", None),
    StoreUnavailable: (503, "no responses database", "server_error", "store_unavailable", None),
    CountUnavailable: (503, "not counted in time", "server_error", "count_unavailable", None),
    StoreFull: (400, "this key keeps too much", INVALID, "store_quota_exceeded", "store"),
    StatusError: (400, "malformed", INVALID, None, None),
    InternalError: (
        500,
        "internal error; look up request id req-1 in the server log",
        "server_error",
        "internal_error",
        None,
    ),
    LocalUnavailable: (503, "no local answer", "server_error", "local_unavailable", None),
    UpstreamError: (502, "API failed", "upstream_error", "upstream_failed", None),
    UpstreamTimeout: (504, "API too slow", "upstream_error", "upstream_timeout", None),
    UpstreamRateLimited: (429, "API busy", "requests", "rate_limit_exceeded", None),
    UpstreamStatus: (400, "bad", INVALID, None, "x"),
}

# The classes with headers of their own; every other class has none.
HEADERS: dict[type[ProxyError], dict[str, str]] = {
    Unauthorized: {"www-authenticate": "Bearer"},
    MethodNotAllowed: {"allow": "POST"},
    TooManyRequests: {"retry-after": "1"},
    InternalError: {"x-request-id": "req-1"},
    UpstreamRateLimited: {"retry-after": "3"},
}


def _subclasses(cls: type[ProxyError]) -> Iterator[type[ProxyError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _sse_payload(event: bytes) -> Any:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[len(b"data: ") : -2])


def test_every_proxy_error_class_has_its_shape_pinned() -> None:
    classes = set(_subclasses(ProxyError))
    assert classes == set(CASES) == set(BODIES), "a ProxyError subclass without a row (or one gone)"
    assert all(cls.__module__ == "proxy.errors" for cls in classes)


@pytest.mark.parametrize("cls", list(CASES), ids=lambda cls: cls.__name__)
def test_the_json_of_each_error_is_openais_shape_with_its_status_and_headers(
    cls: type[ProxyError],
) -> None:
    status, message, type_, code, param = BODIES[cls]
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    headers = HEADERS.get(cls, {})
    error = CASES[cls]()
    assert type(error) is cls
    response = render(error, "req-1")
    assert response.status_code == status
    assert json.loads(response.body) == body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"] == "req-1"
    for name, value in headers.items():
        assert response.headers[name] == value
    assert error.headers == headers


@pytest.mark.parametrize("cls", list(CASES), ids=lambda cls: cls.__name__)
def test_json_and_sse_carry_the_same_error_object(cls: type[ProxyError]) -> None:
    error = CASES[cls]()
    assert _sse_payload(sse_event(error)) == json.loads(render(error).body) == error.body()


def test_a_stream_that_fails_after_its_first_byte_ends_with_the_same_500_logged_once() -> None:
    try:
        raise KeyError(SECRET)
    except KeyError as exc:
        with capture_logs() as logs:
            error = unexpected(exc, "req-mid", started=True)
    assert _sse_payload(sse_event(error)) == InternalError("req-mid").body()
    [line] = [e for e in logs if e["event"] == "unhandled_error"]
    assert (line["request_id"], line["error"], line["response_started"]) == (
        "req-mid",
        "KeyError",
        True,
    )
    assert SECRET not in repr(logs)


def test_the_tree_in_the_docstring_names_every_class() -> None:
    doc = proxy.errors.__doc__ or ""
    for cls in CASES:
        assert f" {cls.__name__} " in doc, cls.__name__


# -- an in-process app -------------------------------------------------------------------------


async def _boom(request: Request) -> Response:
    raise RuntimeError(f"failed on {SECRET}")


async def _refused(request: Request) -> Response:
    raise BadRequest("temperature is too high", param="temperature")


def _app() -> Starlette:
    return Starlette(
        routes=[Route("/boom", _boom), Route("/refused", _refused, methods=["POST"])],
        exception_handlers=exception_handlers(),
        middleware=[Middleware(RequestIdMiddleware)],
    )


def _client() -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def test_a_500_carries_the_request_id_in_its_header_and_message_and_is_logged_once() -> None:
    async with _client() as client:
        with capture_logs() as logs:
            r = await client.get("/boom", headers={"x-request-id": "req-500"})
    assert r.status_code == 500
    assert r.headers["x-request-id"] == "req-500"
    assert r.json() == InternalError("req-500").body()
    assert "req-500" in r.json()["error"]["message"]
    errors = [e for e in logs if e["event"] == "unhandled_error"]
    assert len(errors) == 1
    assert errors[0]["request_id"] == "req-500" and errors[0]["error"] == "RuntimeError"
    assert SECRET not in repr(logs) and SECRET not in r.text


async def test_a_500_without_a_client_id_names_the_one_it_was_given() -> None:
    async with _client() as client:
        r = await client.get("/boom")
    given = r.headers["x-request-id"]
    assert len(given) == 32
    assert r.json()["error"]["message"] == InternalError(given).message


async def assert_404_and_405(client: httpx.AsyncClient, nowhere: str, post_only: str) -> None:
    """GET ``nowhere`` (no such path) is a 404 and GET ``post_only`` a 405 with its Allow
    header, both in OpenAI's error shape and under the request's own id."""
    missing = await client.get(nowhere, headers={"x-request-id": "req-404"})
    wrong = await client.get(post_only, headers={"x-request-id": "req-405"})
    assert missing.status_code == 404
    assert missing.json() == NotFound(f"no such endpoint: GET {nowhere}").body()
    assert missing.headers["x-request-id"] == "req-404"
    assert wrong.status_code == 405
    assert wrong.json() == MethodNotAllowed(f"method GET is not allowed on {post_only}").body()
    assert wrong.headers["allow"] == "POST"
    assert wrong.headers["x-request-id"] == "req-405"


async def test_404_and_405_come_out_in_the_same_shape() -> None:
    async with _client() as client:
        await assert_404_and_405(client, "/nowhere", "/refused")


async def test_a_proxy_error_raised_by_a_handler_is_rendered_as_it_is() -> None:
    async with _client() as client:
        r = await client.post("/refused", headers={"x-request-id": "req-400"})
    assert r.status_code == 400
    assert r.json() == BadRequest("temperature is too high", param="temperature").body()
    assert r.headers["x-request-id"] == "req-400"
