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
    InternalError,
    LocalUnavailable,
    MethodNotAllowed,
    MisdirectedRequest,
    NotFound,
    PayloadTooLarge,
    ProxyError,
    RequestTimeout,
    StatusError,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamStatus,
    UpstreamTimeout,
)
from proxy.http.app import RequestIdMiddleware
from proxy.http.render import exception_handlers, render, sse_event, unexpected

SECRET = "SECRET-PROMPT-text"


def _shape(message: str, type_: str, code: str | None, param: str | None = None) -> Any:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# Each class: an instance, its status, its JSON body and its own headers.
CASES: dict[type[ProxyError], tuple[Callable[[], ProxyError], int, Any, dict[str, str]]] = {
    BadRequest: (
        lambda: BadRequest("bad n", param="n"),
        400,
        _shape("bad n", "invalid_request_error", "invalid_value", param="n"),
        {},
    ),
    Unauthorized: (
        lambda: Unauthorized("no key"),
        401,
        _shape("no key", "authentication_error", "invalid_api_key"),
        {"www-authenticate": "Bearer"},
    ),
    NotFound: (
        lambda: NotFound("no such endpoint"),
        404,
        _shape("no such endpoint", "invalid_request_error", "not_found"),
        {},
    ),
    MethodNotAllowed: (
        lambda: MethodNotAllowed("not here", headers={"allow": "POST"}),
        405,
        _shape("not here", "invalid_request_error", "method_not_allowed"),
        {"allow": "POST"},
    ),
    RequestTimeout: (
        lambda: RequestTimeout("too slow"),
        408,
        _shape("too slow", "invalid_request_error", "request_timeout"),
        {},
    ),
    PayloadTooLarge: (
        lambda: PayloadTooLarge("too big"),
        413,
        _shape("too big", "invalid_request_error", "request_too_large"),
        {},
    ),
    UnsupportedMediaType: (
        lambda: UnsupportedMediaType("send JSON"),
        415,
        _shape("send JSON", "invalid_request_error", "unsupported_media_type"),
        {},
    ),
    MisdirectedRequest: (
        lambda: MisdirectedRequest("wrong host"),
        421,
        _shape("wrong host", "invalid_request_error", "misdirected_request"),
        {},
    ),
    TooManyRequests: (
        lambda: TooManyRequests("busy"),
        429,
        _shape("busy", "requests", "rate_limit_exceeded"),
        {"retry-after": "1"},
    ),
    StatusError: (
        lambda: StatusError(400, "malformed"),
        400,
        _shape("malformed", "invalid_request_error", None),
        {},
    ),
    InternalError: (
        lambda: InternalError("req-1"),
        500,
        _shape(
            "internal error; look up request id req-1 in the server log",
            "server_error",
            "internal_error",
        ),
        {"x-request-id": "req-1"},
    ),
    LocalUnavailable: (
        lambda: LocalUnavailable("no local answer"),
        503,
        _shape("no local answer", "server_error", "local_unavailable"),
        {},
    ),
    UpstreamError: (
        lambda: UpstreamError("API failed"),
        502,
        _shape("API failed", "upstream_error", "upstream_failed"),
        {},
    ),
    UpstreamTimeout: (
        lambda: UpstreamTimeout("API too slow"),
        504,
        _shape("API too slow", "upstream_error", "upstream_timeout"),
        {},
    ),
    UpstreamRateLimited: (
        lambda: UpstreamRateLimited("API busy", retry_after_s=2.5),
        429,
        _shape("API busy", "requests", "rate_limit_exceeded"),
        {"retry-after": "3"},
    ),
    UpstreamStatus: (
        lambda: UpstreamStatus(
            400,
            {"error": {"message": "bad", "type": "invalid_request_error", "param": "x"}},
            "the upstream API refused the request (HTTP 400)",
        ),
        400,
        _shape("bad", "invalid_request_error", None, param="x"),
        {},
    ),
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
    assert classes == set(CASES), "a ProxyError subclass without a row in CASES (or one gone)"
    assert all(cls.__module__ == "proxy.errors" for cls in classes)


@pytest.mark.parametrize("cls", list(CASES), ids=lambda cls: cls.__name__)
def test_the_json_of_each_error_is_openais_shape_with_its_status_and_headers(
    cls: type[ProxyError],
) -> None:
    make, status, body, headers = CASES[cls]
    error = make()
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
    error = CASES[cls][0]()
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


async def test_404_and_405_come_out_in_the_same_shape() -> None:
    async with _client() as client:
        missing = await client.get("/nowhere", headers={"x-request-id": "req-404"})
        wrong = await client.get("/refused", headers={"x-request-id": "req-405"})
    assert missing.status_code == 404
    assert missing.json() == NotFound("no such endpoint: GET /nowhere").body()
    assert missing.headers["x-request-id"] == "req-404"
    assert wrong.status_code == 405
    assert wrong.json() == MethodNotAllowed("method GET is not allowed on /refused").body()
    assert wrong.headers["allow"] == "POST"
    assert wrong.headers["x-request-id"] == "req-405"


async def test_a_proxy_error_raised_by_a_handler_is_rendered_as_it_is() -> None:
    async with _client() as client:
        r = await client.post("/refused", headers={"x-request-id": "req-400"})
    assert r.status_code == 400
    assert r.json() == BadRequest("temperature is too high", param="temperature").body()
    assert r.headers["x-request-id"] == "req-400"
