"""The engine worker: a separate process that owns ``llama_cpp.Llama``.

It is started with the ``spawn`` method and talks to the proxy over one duplex pipe:

    proxy -> worker   ("job", job_id, request, stream, deadline)   |  ("shutdown",)
    worker -> proxy   ("ready", info)  |  ("fatal", message)
                      ("token", job_id, text)  |  ("done", job_id, completion)
                      ("error", job_id, kind, message)

A job stops early when its ``deadline`` (``time.monotonic()``, which is shared by every process on
the machine) passes, or when the proxy writes its id into the shared ``cancel`` value. If the
worker ever fails to stop, the proxy kills it and starts another; see ``client.py``.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from proxy.engine.generate import LocalModel, ModelLoadError, PromptTooLong


def worker_main(conn: Connection, cancel: Any, options: dict[str, Any]) -> None:
    """Entry point of the worker process."""
    # The proxy decides when the worker stops; a Ctrl-C in the terminal reaches the whole
    # process group, and the worker must not die before the proxy has drained.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    started = time.perf_counter()
    try:
        model = LocalModel.load(
            options["model_path"],
            n_ctx=options["n_ctx"],
            n_threads=options["n_threads"],
            seed=options.get("seed", 0),
            speculative=options.get("speculative", "off"),
            default_max_tokens=options.get("default_max_tokens", 512),
        )
    except ModelLoadError as exc:
        conn.send(("fatal", str(exc)))
        return
    conn.send(
        (
            "ready",
            {
                "pid": os.getpid(),
                "model": model.model_name,
                "model_path": model.path,
                "n_ctx": model.n_ctx,
                "n_threads": options["n_threads"],
                "load_s": time.perf_counter() - started,
            },
        )
    )
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "shutdown":
            return
        _, job_id, request, stream, deadline = message
        _run_job(conn, cancel, model, job_id, request, stream, deadline)


def _run_job(
    conn: Connection,
    cancel: Any,
    model: LocalModel,
    job_id: int,
    request: dict[str, Any],
    stream: bool,
    deadline: float,
) -> None:
    def should_stop() -> str | None:
        if cancel.value == job_id:
            return "cancelled"
        if time.monotonic() >= deadline:
            return "deadline"
        return None

    def on_token(text: str) -> None:
        conn.send(("token", job_id, text))

    try:
        completion = model.chat(
            request, on_token=on_token if stream else None, should_stop=should_stop
        )
        # Scoring here keeps its CPU off the proxy's event loop.
        completion["frugal"]["quality"] = _score(request, completion)
    except PromptTooLong as exc:
        conn.send(("error", job_id, "context_overflow", str(exc)))
    except Exception as exc:  # noqa: BLE001 - anything llama.cpp raises becomes a fallback
        conn.send(("error", job_id, "local_error", f"{type(exc).__name__}: {exc}"))
    else:
        conn.send(("done", job_id, completion))


def _score(request: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    import quality

    verdict = quality.score(request, completion)
    return {"value": verdict.value, "reasons": verdict.reasons, "signals": verdict.signals}
