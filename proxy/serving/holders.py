"""Who holds a lease in the ledger database: a background response's (``lease_owner``) and a
batch line's (``worker``) holder is named after its process, ``host:pid`` (a batch runner adds
``:suffix``, one per runner), so that another process can tell a holder that is gone without
waiting for its lease to pass.

:func:`gone` says so only for a process of this host (same host name) whose pid names no process
now: a proxy restarted after ``kill -9``, or a replica of this host killed. A holder on another
host, a name that does not parse, and this process's own pid are never gone here: those wait
for their lease. Replicas on several hosts must have host names of their own (as machines and
containers do); a pid reused by another process only makes the wait longer, never shorter.
"""

from __future__ import annotations

import os
import socket


def holder() -> str:
    """This process's name on the leases it holds: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def gone(name: str | None) -> bool:
    """Whether the holder ``name`` (``host:pid[:suffix]``) was a process of this host that is
    gone."""
    parts = (name or "").split(":")
    if len(parts) < 2 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if parts[0] != socket.gethostname() or pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # no signal sent: whether the process exists
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's): alive
        return False
    return False
