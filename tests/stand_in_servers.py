"""A stand-in inference server on loopback that publishes its load as llama-server, vLLM or
Ollama does, for ``tests/routing/test_remote_load.py``.

It answers ``POST /v1/chat/completions`` at once with a short answer (with llama-server's
``timings`` for that kind), lists its model at ``GET /v1/models``, and publishes what its knobs
say: ``running`` and ``waiting`` (the requests "another client" has on it), ``slots``, and
``metrics``/``slots_page``/``ps`` to replace a published page's text (a bad page). ``model`` is
the model it lists and answers as. ``paths`` records every path asked for, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.loopback import ThreadedServer, quiet_config


class StandIn:
    """One stand-in server of ``kind`` ("llama-server", "vllm" or "ollama")."""

    def __init__(self, kind: str, *, model: str = "local") -> None:
        self.kind = kind
        self.model = model
        self.answer_model: str | None = None  # answers as another model when set
        self.running = 0
        self.waiting = 0
        self.slots = 4
        self.metrics: str | None = None  # replaces /metrics' text
        self.slots_page: str | None = None  # replaces /slots' text
        self.ps: str | None = None  # replaces /api/ps' text
        self.chat_body: str | None = None  # replaces the chat answer's text
        self.paths: list[str] = []
        self.host, self.port = "127.0.0.1", 0
        self._served: ThreadedServer | None = None
        self.app = Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/slots", self._slots, methods=["GET"]),
                Route("/api/ps", self._ps, methods=["GET"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> StandIn:
        config = quiet_config(self.app)
        self._served = ThreadedServer(config, host=self.host, name=f"stand-in-{self.kind}")
        self.port = self._served.start()
        return self

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()
            self._served = None

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- pages ---------------------------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        self.paths.append("/health")
        return JSONResponse({"status": "ok"})

    async def _metrics(self, request: Request) -> Response:
        self.paths.append("/metrics")
        if self.metrics is not None:
            return PlainTextResponse(self.metrics)
        if self.kind == "llama-server":
            text = (
                "# HELP llamacpp:requests_processing Number of requests processing.\n"
                "# TYPE llamacpp:requests_processing gauge\n"
                f"llamacpp:requests_processing {self.running}\n"
                "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
                "# TYPE llamacpp:requests_deferred gauge\n"
                f"llamacpp:requests_deferred {self.waiting}\n"
            )
        elif self.kind == "vllm":
            label = f'{{model_name="{self.model}"}}'
            text = (
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{label} {float(self.running)}\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{label} {float(self.waiting)}\n"
            )
        else:
            return PlainTextResponse("not found", status_code=404)
        return PlainTextResponse(text)

    def _own_page(self, kind: str, page: str | None, published: Callable[[], Any]) -> Response:
        """A page only servers of ``kind`` have (404 for the others): the text of ``page`` when
        a test set it, else what ``published`` gives, as JSON."""
        if self.kind != kind:
            return PlainTextResponse("not found", status_code=404)
        if page is not None:
            return PlainTextResponse(page)
        return JSONResponse(published())

    async def _slots(self, request: Request) -> Response:
        self.paths.append("/slots")
        return self._own_page(
            "llama-server",
            self.slots_page,
            lambda: [{"id": i, "is_processing": i < self.running} for i in range(self.slots)],
        )

    async def _ps(self, request: Request) -> Response:
        self.paths.append("/api/ps")
        return self._own_page(
            "ollama", self.ps, lambda: {"models": [{"name": self.model, "model": self.model}]}
        )

    async def _models(self, request: Request) -> Response:
        self.paths.append("/v1/models")
        data = [{"id": self.model, "object": "model", "created": 0, "owned_by": self.kind}]
        return JSONResponse({"object": "list", "data": data})

    async def _chat(self, request: Request) -> Response:
        self.paths.append("/v1/chat/completions")
        if self.chat_body is not None:
            return PlainTextResponse(self.chat_body, media_type="application/json")
        answer: dict[str, Any] = {
            "id": "chatcmpl-stand-in",
            "object": "chat.completion",
            "created": 0,
            "model": self.answer_model or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Paris."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23},
        }
        return JSONResponse(answer)
