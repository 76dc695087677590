"""Opening a GGUF with llama.cpp: the one place that calls ``Llama(...)`` and turns its refusals
(a file it cannot read, a file that is not a model it knows) into the caller's own error.

Both models go through it: the engine's chat model (``proxy.engine.model_files``) and the
relevance signal's embedding model (``quality.relevance``). llama.cpp is imported on the first
call, so importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any


def open_llama(path: str, refused: type[Exception], **options: Any) -> Any:
    """``llama_cpp.Llama`` on ``path`` with ``options`` and its logging off; a load that fails
    raises ``refused("cannot load model <path>: <why>")``."""
    from llama_cpp import Llama

    try:
        return Llama(model_path=path, verbose=False, **options)
    except (ValueError, RuntimeError, OSError) as exc:
        raise refused(f"cannot load model {path}: {exc}") from exc
