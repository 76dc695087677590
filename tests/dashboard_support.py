"""The dashboard's tests and its screenshot: a seeded ledger, and Chromium driven by Playwright.

    seed(db)                 three months of made-up traffic, into a new SQLite ledger
    chromium()               Debian's Chromium (/usr/bin/chromium), headless, through Playwright
    open_dashboard(page, url)  load the page; what it fetched (bytes) and what its console said

The ledger:

- **October 2026** (``GOOD_MONTH``): about 9,000 requests over every day, four requested models
  (one of them named ``XSS_MODEL``, an HTML tag that must be shown as text), three client keys and
  none, every routing reason the cascade writes, latency tax on the rejected local attempts, and
  60 shadow audits. It saves more than the server's $40 a month: the net is positive.
- **September 2026** (``LOSING_MONTH``): a quiet month whose savings do not pay for the server.
- **November 2026** has nothing (an empty month); the current month has a few requests.

The rows are drawn from a seeded generator, so every run writes the same ledger; the costs are
in pico-dollars as the proxy stores them, with prices that leave the sums uneven to the
micro-dollar (the page must print them exactly).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.ledger.audits.audit_record import AuditRecord
from proxy.ledger.audits.table import AUDIT_INSERT, audit_values
from proxy.ledger.db import access, postgres
from proxy.ledger.db.location import Database, as_database
from proxy.ledger.db.migrate import open_database

if TYPE_CHECKING:  # playwright is imported where a browser is started
    from playwright.sync_api import Browser, ConsoleMessage, Page, Request

GOOD_MONTH = "2026-10"
LOSING_MONTH = "2026-09"
EMPTY_MONTH = "2026-11"
XSS_MODEL = "<img src=x onerror=alert(1)>"
KEYS = ("ci", "alice", "batch-jobs", None)

# (requested model, pico-dollars per prompt token, per completion token, weight)
MODELS = (
    ("gpt-4o", 2_500_000, 10_000_000, 5),
    ("gpt-4o-mini", 150_000, 600_000, 3),
    ("claude-sonnet-4-20250514", 3_000_000, 15_000_000, 2),
    (XSS_MODEL, 1_100_000, 4_400_000, 1),
)
# (route, reason, weight): what the cascade writes, roughly as often as a small VPS sees it.
ROUTES = (
    ("local", "accepted", 66),
    ("local", "cache", 3),
    ("api", "low_quality", 11),
    ("api", "local_timeout", 4),
    ("api", "predicted_slow", 6),
    ("api", "context_overflow", 3),
    ("api", "forced", 3),
    ("none", "bad_request", 2),
)
TAXED = {"low_quality", "local_timeout"}


def _day(label: str, day: int) -> datetime:
    year, month = (int(x) for x in label.split("-"))
    return datetime(year, month, 1, tzinfo=UTC) + timedelta(days=day - 1)


def _rows(rng: random.Random, start: datetime, days: int, per_day: tuple[int, int]) -> list[Any]:
    out: list[dict[str, Any]] = []
    models = [m for m in MODELS for _ in range(m[3])]
    routes = [r for r in ROUTES for _ in range(r[2])]
    for offset in range(days):
        day = start + timedelta(days=offset)
        weekend = day.weekday() >= 5
        low, high = per_day
        count = rng.randint(low, high) // (3 if weekend else 1)
        for _ in range(count):
            model, p_in, p_out, _w = rng.choice(models)
            route, reason, _w = rng.choice(routes)
            prompt, completion = rng.randint(300, 8000), rng.randint(40, 1200)
            cost = prompt * p_in + completion * p_out
            status = 400 if route == "none" else 200
            tax = rng.uniform(600, 9000) if reason in TAXED else 0.0
            out.append(
                {
                    "request_id": f"{len(out):08x}{int(day.timestamp()):x}",
                    "ts": day.timestamp() + rng.uniform(0, 86_399),
                    "endpoint": "chat.completions",
                    "requested_model": model,
                    "api_model": model,
                    "route": route,
                    "reason": reason,
                    "status": status,
                    "latency_ms": tax + rng.uniform(150, 2500),
                    "local_ms": tax if route == "api" else rng.uniform(200, 4000),
                    "latency_tax_ms": tax,
                    "api_cost_pusd": cost if route == "api" else (None if status >= 400 else 0),
                    "counterfactual_cost_pusd": None if status >= 400 else cost,
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "key_name": rng.choice(KEYS),
                }
            )
    return out


def _audits(rng: random.Random, start: datetime) -> list[AuditRecord]:
    """60 audits: 52 accepted answers (48 right), 8 rejected ones (2 right)."""
    out = []
    for i in range(60):
        accepted = i < 52
        right = i < 48 if accepted else i < 54
        out.append(
            AuditRecord(
                accepted=accepted,
                verdict=right,
                ts=(
                    start + timedelta(days=rng.randint(0, 29), seconds=rng.randint(0, 86_399))
                ).timestamp(),
                requested_model=rng.choice(MODELS)[0],
                task_kind=rng.choice(("facts", "format", "extraction", "code")),
                score=rng.uniform(0.62, 0.98) if accepted else rng.uniform(0.1, 0.58),
                method="judge",
                cost_pusd=rng.randint(200_000_000, 900_000_000),
            )
        )
    return out


def seed(db: Path | str | Database, *, now: datetime | None = None) -> None:
    """Write the three months (and a few requests this month) into a new ledger: a SQLite path,
    or a PostgreSQL database (a :class:`Database`)."""
    now = now or datetime.now(UTC)
    rng = random.Random(20)
    rows = _rows(rng, _day(GOOD_MONTH, 1), 31, (280, 420))
    rows += _rows(rng, _day(LOSING_MONTH, 1), 30, (20, 40))
    # The audits are drawn before this month's rows: how many days this month has had so far
    # must not change October's audits (and so its net) from one day to the next.
    audits = [audit_values(a.row(log_content=False)) for a in _audits(rng, _day(GOOD_MONTH, 1))]
    this_month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if this_month > _day(GOOD_MONTH, 31):
        rows += _rows(rng, this_month, max(1, now.day - 1), (10, 20))
    names = list(rows[0])
    insert = f"INSERT INTO requests ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"
    values = [[row[n] for n in names] for row in rows]
    database = as_database(str(db) if isinstance(db, Path) else db)
    open_database(database)
    with access.connect(database) as conn:
        if database.is_postgres:
            with conn.raw.transaction(), conn.raw.cursor() as cursor:
                cursor.executemany(postgres.sql(insert), values)
                cursor.executemany(postgres.sql(AUDIT_INSERT), audits)
        else:
            conn.raw.execute("BEGIN")
            conn.raw.executemany(insert, values)
            conn.raw.executemany(AUDIT_INSERT, audits)
            conn.raw.execute("COMMIT")


# -- the browser ------------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium, headless (Playwright's own browser downloads are not used)."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        raise RuntimeError(
            f"{CHROMIUM} is missing: the dashboard's browser tests need Debian's Chromium "
            "(apt-get install chromium; ./dev test installs it when run as root)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class PageLoad:
    """What loading the page cost, and what its console said."""

    fetched: list[tuple[str, int]] = field(default_factory=list)  # (url, bytes on the wire)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.fetched)


def watch(page: Page) -> PageLoad:
    """Record, from now on, every response ``page`` receives (headers and body as sent) and every
    console error and uncaught exception."""
    load = PageLoad()

    def finished(request: Request) -> None:
        sizes = request.sizes()
        load.fetched.append((request.url, sizes["responseHeadersSize"] + sizes["responseBodySize"]))

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            load.console_errors.append(message.text)

    page.on("requestfinished", finished)
    page.on("console", console)
    page.on("pageerror", lambda exc: load.page_errors.append(str(exc)))
    return load


def open_dashboard(page: Page, url: str, *, month: str | None = None) -> PageLoad:
    """Load the page at ``url`` (``#month=`` added when given) until it shows a month's report,
    or its login prompt; returns what it fetched on the way."""
    load = watch(page)
    page.goto(url + (f"#month={month}" if month else ""))
    page.wait_for_selector("#board[data-month], #login:not([hidden])")
    page.wait_for_load_state("networkidle")
    return load
