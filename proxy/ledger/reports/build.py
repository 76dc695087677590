"""``frugal report``: what a period cost, and what it would have cost on the API.

The ledger is SQLite or PostgreSQL (``--db PATH``, ``sqlite:///PATH`` or
``postgresql://USER@HOST/DB``); the same queries run on both. Money is summed as integers (pico-
dollars) by the database and in Python, and becomes a Decimal only at the end, so the totals
equal the sum of the rows exactly (to the micro-dollar in JSON, where it is a number, CSV and
markdown; to 1/100 of a cent in the table). The queries and their totals are
:mod:`proxy.ledger.reports.rollup`'s (the daily rollup ``requests_daily``); rendering is
:mod:`proxy.ledger.reports.formats`'s. This module holds the period, its fixed cost, and the
report's assembly.

- counterfactual: what every answered request would have cost on the API (the requested model's
  price, see :func:`proxy.ledger.pricing.apply_costs`); paid: what the API calls cost; saved:
  the difference; fixed: ``[costs] monthly_fixed_usd`` prorated over the period, each calendar
  month by the share of its seconds the period covers, up to now; net: saved − fixed.
- latency tax: the time spent on local attempts whose answer was not used, its share of the
  answered requests, and its p95 (nearest rank) over the requests that paid it.
- quality: what the period's shadow audits say (``docs/audit.md``; the keys are
  :mod:`proxy.ledger.reports.audit_quality`'s): audited precision with its 95% interval, the share
  of rejected answers that were right, and the threshold in force. What the audits cost
  (``audit_cost_usd``) is money paid: it is part of ``api_cost_usd``, never of the savings.
  ``--by kind`` groups the quality keys by task kind (requests have no kind); ``--by model``
  groups both.
- deferred work (``deferred``): the requests that said they can wait (``service_tier:
  "flex"``), apart: their requests, local share, cost and saving, by the same sums as the
  totals, of which they are a part (:func:`proxy.ledger.reports.rollup.deferred_work`).
- rows that could not be costed (an unpriced model, or an API call that reported no usage) are
  counted, left out of the money, and named in ``warnings``.
- one key's view (``only=KeyScope(...)``, what a client key is sent over HTTP): every figure
  counts that key's requests alone, from the day it was stored (a revoked key of the same name
  before it is not counted, but for the rows of that day: the rollup is kept per day); its
  budget is its own; the audit figures and the fixed cost are the server's and are left out
  (zero, and no audits), so its net saving is its saving.

Exit codes (the CLI returns them): 0 a report; 2 a bad option or config; 3 no ledger (no file,
not a readable ledger, or a PostgreSQL server that cannot be reached); 4 the ledger has no
request in the period (the zero report is still printed, and a message goes to stderr).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

from proxy.errors import ConfigError, UserError
from proxy.ledger.audits.table import read_rows, spend_pusd
from proxy.ledger.db import access
from proxy.ledger.db.location import Database, as_database
from proxy.ledger.pricing import PICO
from proxy.ledger.reports.audit_quality import quality_section
from proxy.ledger.reports.budget_use import budget_use
from proxy.ledger.reports.formats import render
from proxy.ledger.reports.rollup import (
    OTHER_MODELS,
    Totals,
    aggregate,
    cost_warnings,
    deferred_work,
    fold_unpriced,
    latency_p95,
    money,
    prediction_error,
    rollup_query,
)

__all__ = ["GROUPINGS", "FORMATS", "KeyScope", "Period", "ReportError", "build", "render"]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_DATABASE = 3
EXIT_EMPTY = 4

GROUPINGS = ("model", "day", "key", "reason", "kind")
FORMATS = ("table", "json", "csv", "markdown")
_DAY = timedelta(days=1)


class ReportError(UserError):
    """A report that cannot be produced; carries the CLI exit code."""

    label = "frugal report"

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message, exit_code)


@dataclass(frozen=True, slots=True)
class KeyScope:
    """One client key's view of the ledger: its own requests, from when it was stored."""

    name: str
    since: float | None = None  # when it was stored (None: a key of the environment's)


# -- the period -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Period:
    label: str
    start: datetime  # inclusive, UTC
    end: datetime  # exclusive

    @classmethod
    def month(cls, text: str | None, now: datetime | None = None) -> Period:
        now = now or datetime.now(UTC)
        if text is None:
            year, month = now.year, now.month
        else:
            try:
                year_s, month_s = text.split("-")
                year, month = int(year_s), int(month_s)
                if not 1 <= month <= 12 or len(year_s) != 4 or len(month_s) != 2:
                    raise ValueError
                start = datetime(year, month, 1, tzinfo=UTC)
                end = _next_month(start)  # year 0 and 9999-12 have no datetime: refused here
            except ValueError:
                raise ReportError(
                    f"--month {text!r}: expected YYYY-MM, e.g. 2026-11", EXIT_USAGE
                ) from None
            return cls(f"{year:04d}-{month:02d}", start, end)
        start = datetime(year, month, 1, tzinfo=UTC)
        return cls(f"{year:04d}-{month:02d}", start, _next_month(start))

    @classmethod
    def between(cls, first: str, last: str | None, now: datetime | None = None) -> Period:
        """``--from FIRST --to LAST``: whole UTC days, both included; LAST defaults to today."""
        now = now or datetime.now(UTC)
        start = _parse_day("--from", first)
        last_day = (
            _parse_day("--to", last)
            if last
            else now.replace(hour=0, minute=0, second=0, microsecond=0)
        )
        if last_day < start:
            raise ReportError(f"--to {last_day.date()} is before --from {first}", EXIT_USAGE)
        end = last_day + _DAY
        return cls(f"{start.date()}..{last_day.date()}", start, end)

    @property
    def last_day(self) -> date:
        return (self.end - _DAY).date()

    def days(self, now: datetime) -> list[datetime]:
        """Every day of the period up to today."""
        out, day = [], self.start
        while day < self.end and day <= now:
            out.append(day)
            day += _DAY
        return out


def _parse_day(option: str, text: str) -> datetime:
    try:
        day = date.fromisoformat(text)
        if len(text) != 10:
            raise ValueError
    except ValueError:
        raise ReportError(f"{option} {text!r}: expected YYYY-MM-DD", EXIT_USAGE) from None
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _next_month(moment: datetime) -> datetime:
    return datetime(moment.year + (moment.month == 12), moment.month % 12 + 1, 1, tzinfo=UTC)


def fixed_cost_pico(start: datetime, end: datetime, monthly_pico: int, now: datetime) -> int:
    """``monthly_pico`` per calendar month, prorated by the seconds of ``[start, end)`` that
    have passed: each month contributes its covered share."""
    end = min(end, max(now, start))
    total = Fraction(0)
    cursor = start
    while cursor < end:
        month_start = datetime(cursor.year, cursor.month, 1, tzinfo=UTC)
        month_end = _next_month(month_start)
        upto = min(end, month_end)
        covered = (upto - cursor) // timedelta(microseconds=1)
        length = (month_end - month_start) // timedelta(microseconds=1)
        total += Fraction(monthly_pico * covered, length)
        cursor = upto
    return round(total)


@contextmanager
def _connect(db: Database) -> Iterator[access.Connection]:
    """Open the ledger for reading, upgrading it first if an older proxy wrote it."""
    from proxy.ledger.db.migrate import open_database, schema_state

    if (missing := db.missing("recorded any request")) is not None:
        raise ReportError(missing, EXIT_NO_DATABASE)
    try:
        if schema_state(db)[1]:
            open_database(db)
        with access.connect(db, readonly=True) as conn:
            yield conn
    except (sqlite3.DatabaseError, ConfigError) as exc:
        raise ReportError(f"cannot read the ledger at {db.label}: {exc}", EXIT_NO_DATABASE) from exc


def build(
    db_path: str | Database,
    period: Period,
    monthly_fixed_usd: float | Decimal,
    *,
    by: str | None = None,
    daily: bool = False,
    now: datetime | None = None,
    target_precision: float | None = None,
    threshold: float = 0.6,
    only: KeyScope | None = None,
) -> dict[str, Any]:
    """The report as a dict (what ``--format json`` prints). ``daily`` adds the per-day series
    the chart draws, whatever ``by`` is. ``target_precision`` and ``threshold`` are ``[quality]``'s:
    the threshold in force is chosen from the period's audits as the proxy chooses it.
    ``only``: one key's view (see the module)."""
    if by is not None and by not in GROUPINGS:
        raise ReportError(f"--by {by!r}: expected one of {', '.join(GROUPINGS)}", EXIT_USAGE)
    now = now or datetime.now(UTC)
    # One key's view leaves out the server's own figures: its fixed cost and its audits.
    whole = only is None
    monthly_pico = int(Decimal(str(monthly_fixed_usd)) * PICO) if whole else 0
    db = as_database(db_path)
    with _connect(db) as conn:
        columns = conn.columns("requests")
        bounds = (period.start.timestamp(), period.end.timestamp())
        key = None
        if only is not None:
            key = only.name
            if only.since is not None:
                bounds = (max(bounds[0], only.since), max(bounds[1], only.since))
        days_range = (int(bounds[0]) // 86400, int(bounds[1]) // 86400)
        groups = aggregate(conn, rollup_query(by, key), days_range, key)
        folded = 0
        if by == "model":
            groups, folded = fold_unpriced(groups)
        days = None
        if by == "day":
            days = groups
        elif daily:
            days = aggregate(conn, rollup_query("day", key), days_range, key)
        total = Totals()
        for totals in groups.values():
            total.add(totals)
        p95 = latency_p95(conn, bounds, total.taxed, key)
        prediction = prediction_error(conn, bounds, key) if "actual_local_ms" in columns else None
        deferred = deferred_work(conn, bounds, key) if "deferred_tier" in columns else None
        warnings = cost_warnings(conn, days_range, key) if total.uncosted else []
        audit_pico = spend_pusd(conn, since=bounds[0], until=bounds[1]) if whole else 0
        quality = quality_section(
            read_rows(conn, since=bounds[0], until=bounds[1]) if whole else [],  # no key on them
            by=by,
            target_precision=target_precision,
            threshold=threshold,
        )
        # --by key: each key's monthly budget and its use, in the period's last month.
        budgets = budget_use(conn, period.last_day.strftime("%Y-%m")) if by == "key" else {}
        if key is not None:
            budgets = {key: budgets[key]} if key in budgets else {}
    total.paid += audit_pico  # audits are money paid, never money saved

    total.fixed = fixed_cost_pico(period.start, period.end, monthly_pico, now)
    report: dict[str, Any] = {
        "month": period.label,
        "from": period.start.date().isoformat(),
        "to": period.last_day.isoformat(),
        **total.as_dict(),
        "latency_tax_p95_s": p95,
        "reasons": dict(sorted(total.reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "warnings": warnings,
        "audit_cost_usd": money(audit_pico),
        **quality,
        "deferred": deferred if deferred is not None else _no_deferred_work(),
    }
    if prediction is not None:  # only when the period has predicted local answers
        report["prediction_mdape"], report["prediction_samples"] = prediction
    if by is not None:
        report["by"] = by
        if by != "kind":
            report["groups"] = _group_list(by, groups, period, monthly_pico, now)
            for group in report["groups"] if folded else ():
                if group["model"] == OTHER_MODELS:
                    group["models_folded"] = folded
            for group in report["groups"] if by == "key" else ():
                group.update(budgets.get(group["key"] or "", {}))
    if days is not None:
        report["days"] = _group_list("day", days, period, monthly_pico, now)
    return report


def _no_deferred_work() -> dict[str, Any]:
    """The deferred section of a ledger written before deferred work was marked: none."""
    return {**Totals().as_dict(), "tiers": {}}


def _group_list(
    by: str, groups: dict[Any, Totals], period: Period, monthly_pico: int, now: datetime
) -> list[dict[str, Any]]:
    if by == "day":
        out = []
        for day in period.days(now):
            totals = groups.get(int(day.timestamp()) // 86400, Totals())
            totals.fixed = fixed_cost_pico(day, day + _DAY, monthly_pico, now)
            out.append({"day": day.date().isoformat(), **totals.as_dict()})
        return out
    label = {"model": "model", "key": "key", "reason": "reason"}[by]
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1].requests, str(kv[0])))
    return [{label: key, **totals.as_dict()} for key, totals in ordered]
