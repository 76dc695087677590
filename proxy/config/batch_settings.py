"""``[batch]``: work that can wait (OpenAI's Batch API), validated when it is made.

The config loader coerces each TOML value to the field's type and builds
:class:`BatchSettings`; the ranges are checked here, so that a dataclass made in code is held to
the same rules. A bad value raises :class:`~proxy.errors.ConfigError` naming the key.

The fields here are those of the upstream side (:mod:`proxy.upstream.batch_api`): how the lines
that must reach the paid API are sent there, and the bounds on what comes back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from proxy.errors import ConfigError

FALLBACK_MODES = ("batch", "flex", "sync")
"""``batch``: the upstream's own Batch API (a file, a batch, polled); ``flex``: one call per
line with ``service_tier: "flex"``; ``sync``: one call per line, as an interactive request."""


@dataclass(frozen=True, kw_only=True)
class BatchSettings:
    fallback: str = "batch"  # "batch" | "flex" | "sync"
    poll_interval_s: float = 5.0  # the first wait between polls of an upstream batch
    max_poll_interval_s: float = 60.0  # the wait doubles after each poll, up to this
    max_output_bytes: int = 512 * 1024 * 1024  # an upstream batch's output (or error) file
    sync_concurrency: int = 4  # single calls in flight at once, in the "flex" and "sync" modes
    # ``service_tier: "flex"`` gets this local deadline in place of ``[local] timeout_s``
    # (proxy/routing/router.py); the three below are the ledger's side (proxy/ledger/batches/),
    # their ranges checked by proxy/config/checks.py with the rest of the file.
    flex_timeout_s: float = 600.0
    file_quota_bytes: int = 2 * 1024**3  # the bytes of files one key keeps (2 GiB)
    line_lease_s: float = 300.0  # a claimed batch line is another worker's after this long
    line_max_claims: int = 3  # a line whose workers died this many times fails, not run again

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACK_MODES:
            raise ConfigError(
                f"[batch] fallback = {self.fallback!r}: expected one of "
                + ", ".join(f'"{m}"' for m in FALLBACK_MODES)
            )
        _seconds("poll_interval_s", self.poll_interval_s, 0.01, 3600.0)
        _seconds("max_poll_interval_s", self.max_poll_interval_s, self.poll_interval_s, 3600.0)
        _integer("max_output_bytes", self.max_output_bytes, 1024)
        _integer("sync_concurrency", self.sync_concurrency, 1, 256)


def _seconds(key: str, value: object, low: float, high: float) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(float(value))
        or not low <= float(value) <= high
    ):
        raise ConfigError(
            f"[batch] {key} = {value!r}: expected a number of seconds from {low} to {high}"
        )


def _integer(key: str, value: object, low: int, high: int | None = None) -> None:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise ConfigError(f"[batch] {key} = {value!r}: expected an integer {bound}")
