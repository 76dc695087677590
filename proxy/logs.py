"""structlog, configured once: JSON lines for journald and pipes, a console renderer in a terminal.

Log events carry ids, routes, numbers, error codes and client key *names*. Prompt text,
completions and keys are never passed to the logger (tests/http/test_security.py sends secrets
through a real server and searches its whole output), with one exception the operator opts
into: ``[server] log_content = true`` lowers the level to DEBUG and adds one
``request_content`` event per chat request, with its messages and the answer's text.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(fmt: str = "auto", level: int = logging.INFO) -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
