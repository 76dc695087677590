"""The ``frugal`` command line.

    frugal serve  [--config PATH] [--host H] [--port P] [--insecure-public]
    frugal report [--config PATH | --db PATH|URL] [--month YYYY-MM | --from DAY [--to DAY]]
                  [--format table|json|csv|markdown] [--by model|day|key|reason|kind]
                  [--chart FILE]
    frugal keys   create NAME | list | revoke NAME  [--config PATH | --db PATH|URL]
    frugal migrate [--config PATH | --db PATH|URL]
    frugal batches list [--key NAME] [--limit N] [--format table|json] | show ID | cancel ID
                  [--config PATH | --db PATH|URL]
    frugal check  [--config PATH]
    frugal calibrate [--config PATH] [--db PATH|URL] [--out PATH]
    frugal quantize IN.gguf OUT.gguf [--type Q4_K_M] [--force]
    frugal models pull REPO[:QUANT] [--force] [--stall-timeout S] | list [--format table|json]
                  | rm REPO[:QUANT]

Errors meant for the user (a bad config, a missing database) print one clean line and exit
non-zero: 2 for a usage or config error, 3 when there is no ledger to read, 4 when the ledger
has no request in the period asked for (``frugal report``; the zero report is still printed),
1 when a ``frugal keys``, ``frugal batches`` or ``frugal models`` request cannot be done (a
name taken, no such key or batch, a batch that has ended, a model that does not fit or whose
download is corrupt). Each is a
:class:`proxy.errors.UserError`, with its label and exit code; :func:`main` is the one place
they are caught and printed. A reader that has gone
(``frugal report | head -1``) ends the command quietly, with status 141.

One module per group of commands, each with its options beside the code that runs them:

    __init__  main: the parser assembled from the groups, the one catch of UserError
    serving   frugal serve
    ledger    frugal report, keys and migrate
    batches   frugal batches list | show | cancel
    models    frugal models pull | list | rm, quantize and calibrate
    check     frugal check

Each group has ``add_parsers(sub)``, which adds its commands and sets each one's ``run``
(``args.run(args)``: the exit status). This package is the top of the house: it may import
every room below it (``proxy.server``, ``proxy.models``, ``proxy.audit``, ``proxy.routing`` for
``frugal check``'s probes of the backends, ``proxy.engine``, ``proxy.ledger``), the shared
``proxy.config``, ``proxy.errors`` and ``proxy.logs``, and ``quality``; nothing imports it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from proxy.cli import batches, check, ledger, models, serving
from proxy.errors import UserError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

GROUPS = (serving, ledger, batches, models, check)


def parser() -> argparse.ArgumentParser:
    """The ``frugal`` parser: each group's commands, added by the group."""
    parser = argparse.ArgumentParser(
        prog="frugal",
        description="Local-first OpenAI-compatible proxy: answer on your CPU when good enough, "
        "fall back to the API when not, and count the savings.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``frugal`` command; its exit status.

    A :class:`UserError` from any command is printed here, and only here, as one line with no
    traceback, and its ``exit_code`` returned.
    """
    args = parser().parse_args(argv)
    try:
        status: int = args.run(args)
        # Output to a pipe is buffered: flush it here, so that a reader that has gone shows up
        # below and not in the interpreter's own flush at exit (a message and status 120).
        sys.stdout.flush()
        return status
    except UserError as exc:
        print(f"{exc.label}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `frugal report | head`: the reader has gone, so the rest of the output has nowhere
        # to go. End quietly, and point stdout at /dev/null so the interpreter's own flush at
        # exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
