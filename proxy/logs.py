"""structlog, configured once: JSON lines for journald and pipes, a console renderer in a terminal.

Log events carry ids, routes, numbers, error codes and client key *names*. Prompt text,
completions and keys are never passed to the logger (tests/server/test_security.py sends secrets
through a real server and searches its whole output), with one exception the operator opts
into: ``[server] log_content = true`` lowers the level to DEBUG and adds one
``request_content`` event per chat request, with its messages and the answer's text.

Libraries log too: litellm (through ``logging``, with a plain-text handler of its own), httpx,
Python's ``warnings``, and llama.cpp (C code that prints to stderr). Raw text on stderr would
break the one-JSON-object-a-line log, and a library that echoes part of a request (litellm's
warning about a bad ``image_url``) could write a forged JSON line into it. So
:func:`configure` hands every ``logging`` record (and every warning) to structlog as one
``library_log`` event, with the logger's name and the message as fields, cut at
:data:`MAX_LIBRARY_MESSAGE` characters and without traceback; :func:`adopt_library_loggers`
takes litellm's own handlers away (call it after importing litellm); and
:func:`route_llama_cpp_logs` does the same for llama.cpp's warnings and errors in the engine
worker.

Text from outside (a file name a model hub listed, a model name a client sent) is shown
through :func:`shown` wherever it reaches a terminal or a log line in plain text: every
character :func:`invisible` names (controls, so terminal escapes; format characters, so bidi
overrides; line and paragraph separators; private-use, surrogate and unassigned code points;
spaces other than U+0020; the blank Hangul fillers) is written as a Python escape
(``\\x1b``, ``\\u202e``), so such a name can neither rewrite the screen nor pass for another.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import unicodedata
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

MAX_LIBRARY_MESSAGE = 500
LIBRARY_LOGGERS = ("LiteLLM", "LiteLLM Proxy", "LiteLLM Router")  # each with its own handler
# Controls, format characters (bidi overrides, zero-width joiners), line and paragraph
# separators, surrogates, private use and unassigned code points: none shows as itself.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
# Letters that draw as nothing (Unicode's Hangul fillers, and the blank Braille pattern).
BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def invisible(char: str) -> bool:
    """Whether one character would not show as itself in a terminal or a log line: a control,
    format, separator, surrogate, private-use or unassigned code point, a space other than
    U+0020, or a blank letter (:data:`BLANK_LETTERS`)."""
    category = unicodedata.category(char)
    return (
        category in _HIDDEN_CATEGORIES
        or (category == "Zs" and char != " ")
        or char in BLANK_LETTERS
    )


def shown(text: str) -> str:
    """``text`` safe to print or log: each :func:`invisible` character as a Python escape
    (``\\x1b``, ``\\u202e``, ``\\U000e0001``), everything else as it is."""
    if text.isascii() and text.isprintable():
        return text
    out = []
    for char in text:
        code = ord(char)
        if not invisible(char):
            out.append(char)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def configure(fmt: str = "auto", level: int = logging.INFO) -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    # JSON escapes every control and non-ASCII character itself; the console renderer writes
    # values as they are, so they go through shown() first.
    escape: list[structlog.typing.Processor] = [] if use_json else [_shown_values]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *escape,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    _route_stdlib_logging()


def _shown_values(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """Every text of a console log line (the event and its string fields) through
    :func:`shown`: a name from outside cannot send a terminal escape there."""
    return {k: shown(v) if isinstance(v, str) else v for k, v in event.items()}


class _ToStructlog(logging.Handler):
    """A ``logging`` record as one structlog event: its text is a field, escaped by the JSON
    renderer, so a newline or a brace in it cannot start a line of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a library's bad format string must not raise here
            message = str(record.msg)
        fields: dict[str, Any] = {"logger": record.name[:100], "message": _cut(message)}
        if record.exc_info and record.exc_info[0] is not None:
            fields["error"] = record.exc_info[0].__name__  # the type only: no traceback text
        structlog.get_logger("frugal.library").log(record.levelno, "library_log", **fields)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LIBRARY_MESSAGE else text[:MAX_LIBRARY_MESSAGE] + "…"


def _route_stdlib_logging() -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _ToStructlog):
            root.removeHandler(handler)
    root.addHandler(_ToStructlog())
    root.setLevel(logging.WARNING)  # httpx's INFO line per request is noise, not news
    logging.captureWarnings(True)  # warnings.warn(...) through the same handler
    adopt_library_loggers()


def adopt_library_loggers() -> None:
    """Take away the handlers litellm puts on its loggers (plain text on stderr) so that their
    records reach the root handler of :func:`configure`. Call after importing litellm."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


_llama_callback: Any = None  # kept alive: llama.cpp holds only a C pointer to it
_llama_pending: list[str] = []


def route_llama_cpp_logs() -> None:
    """llama.cpp's warnings and errors as ``library_log`` events of the logger ``llama.cpp``,
    one per line of its text (it sends a line in pieces); its info and debug output is dropped,
    as llama-cpp-python drops it when not verbose."""
    global _llama_callback
    import llama_cpp

    logger = logging.getLogger("llama.cpp")
    # ggml's levels: 1 debug, 2 info, 3 warn, 4 error, 5 the rest of the last message (measured
    # on the bundled build: a missing file is logged at 4; llama-cpp-python's table is older).
    levels = {3: logging.WARNING, 4: logging.ERROR}
    state = {"level": 0}

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def on_log(level: int, text: bytes, user_data: Any) -> None:
        if level != 5:  # 5: the rest of the last message
            state["level"] = level
        if state["level"] not in levels:
            return
        _llama_pending.append((text or b"").decode("utf-8", "replace"))
        joined = "".join(_llama_pending)
        if "\n" in joined or len(joined) > MAX_LIBRARY_MESSAGE:
            _llama_pending.clear()
            logger.log(levels[state["level"]], "%s", joined.strip())

    _llama_callback = on_log
    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
