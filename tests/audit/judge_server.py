"""A judge on a loopback port: an OpenAI-compatible chat endpoint that speaks the judge protocol.

In ``grade`` mode it decides like a (very simple) judge: the candidate is correct when it equals
the reference up to case and surrounding white space and full stops. Other modes misbehave:
``garbage`` (content that is not the verdict object), ``fenced`` (the object in a code fence),
``status`` (an HTTP error with ``status``), ``hang`` (never answers).

With ``relay_to`` (the fake API's URL) it is the whole upstream of an app under test: a judge
call (``response_format`` named ``frugal_verdict``) is judged here, every other request is
relayed to ``relay_to`` and its answer sent back. :meth:`hold` keeps the answers of one kind
(``"judge"`` or ``"relay"``) back until :meth:`release`, so that a test can see an audit still
pending without timing anything.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.audit.judge import Transport
from tests.loopback import ThreadedServer, quiet_config


class JudgeServer:
    def __init__(self, relay_to: str | None = None) -> None:
        self.relay_to = relay_to
        self.gates = {"judge": threading.Event(), "relay": threading.Event()}
        for gate in self.gates.values():
            gate.set()
        self.relayed: list[dict[str, Any]] = []
        self.mode = "grade"
        self.status = 500
        self.garbage = "I think it is fine."
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._served: ThreadedServer | None = None
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    def hold(self, kind: str) -> None:
        self.gates[kind].clear()

    def release(self, kind: str) -> None:
        self.gates[kind].set()

    async def _wait(self, kind: str) -> None:
        while not self.gates[kind].is_set():
            await asyncio.to_thread(self.gates[kind].wait, 0.2)

    async def _relay(self, request: Request, body: dict[str, Any]) -> Response:
        self.relayed.append(body)
        await self._wait("relay")
        assert self.relay_to is not None
        headers = {
            name: request.headers[name]
            for name in ("authorization", "x-request-id")
            if name in request.headers
        }
        async with httpx.AsyncClient(timeout=30) as client:
            answer = await client.post(
                f"{self.relay_to}/chat/completions", json=body, headers=headers
            )
        return Response(
            answer.content,
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type", "application/json"),
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        schema = (body.get("response_format") or {}).get("json_schema") or {}
        if self.relay_to is not None and schema.get("name") != "frugal_verdict":
            return await self._relay(request, body)
        self.requests.append(body)
        await self._wait("judge")
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "status":
            error = {"message": "judge down", "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=self.status)
        case = json.loads(body["messages"][-1]["content"])
        same = _plain(case["candidate"]) == _plain(case["reference"])
        verdict = json.dumps({"correct": same, "reason": "same answer" if same else "differs"})
        content = {"grade": verdict, "fenced": f"```json\n{verdict}\n```"}.get(
            self.mode, self.garbage
        )
        return JSONResponse(
            {
                "id": "chatcmpl-judge",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129},
            }
        )

    def start(self) -> JudgeServer:
        self._served = ThreadedServer(quiet_config(self.app, graceful_s=1), name="judge")
        self.port = self._served.start()
        return self

    def stop(self) -> None:
        for gate in self.gates.values():
            gate.set()
        if self._served is not None:
            self._served.stop()


def _plain(text: str) -> str:
    return text.strip().strip(".").strip().casefold()


def http_transport(client: httpx.AsyncClient, url: str, api_key: str = "unused") -> Transport:
    """The judge transport of docs/audit.md for an OpenAI-compatible base URL."""

    async def send(body: dict[str, Any]) -> dict[str, Any]:
        response = await client.post(
            f"{url}/chat/completions", json=body, headers={"authorization": f"Bearer {api_key}"}
        )
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    return send
