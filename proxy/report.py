"""``frugal report``: what the month cost, and what it would have cost on the API.

All money is summed as integers (pico-dollars) in SQLite and turned into Decimal only for
display, so totals equal the sum of the rows exactly.
"""

from __future__ import annotations

import calendar
import csv
import io
import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from proxy.pricing import PICO

EXIT_OK = 0
EXIT_NO_DATABASE = 3


class ReportError(Exception):
    """A report that cannot be produced; carries the CLI exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Period:
    label: str
    start: datetime
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
                if not 1 <= month <= 12 or len(year_s) != 4:
                    raise ValueError
            except ValueError:
                raise ReportError(f"--month {text!r}: expected YYYY-MM, e.g. 2026-11", 2) from None
        start = datetime(year, month, 1, tzinfo=UTC)
        end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
        return cls(f"{year:04d}-{month:02d}", start, end)

    def month_fraction(self) -> Decimal:
        """How much of a month this period covers (1 for a whole calendar month)."""
        days = calendar.monthrange(self.start.year, self.start.month)[1]
        seconds = Decimal((self.end - self.start).total_seconds())
        return seconds / Decimal(days * 86400)


def _usd(pico: int) -> Decimal:
    return (Decimal(pico) / PICO).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)


def build(db_path: str, period: Period, monthly_fixed_usd: float) -> dict[str, Any]:
    path = Path(db_path)
    if not path.is_file():
        raise ReportError(
            f"no ledger database at {db_path}: the proxy has not recorded any request yet "
            "(or [ledger] path / --db points elsewhere)",
            EXIT_NO_DATABASE,
        )
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute(
            """
            SELECT COUNT(*),
                   COALESCE(SUM(route = 'local'), 0),
                   COALESCE(SUM(route = 'api'), 0),
                   COALESCE(SUM(status >= 400), 0),
                   COALESCE(SUM(api_cost_pusd), 0),
                   COALESCE(SUM(counterfactual_cost_pusd), 0),
                   COALESCE(SUM(counterfactual_cost_pusd IS NULL AND status < 400), 0),
                   COALESCE(SUM(CASE WHEN route = 'api' AND local_ms > 0 THEN local_ms END), 0),
                   COALESCE(SUM(route = 'api' AND local_ms > 0), 0)
            FROM requests WHERE ts >= ? AND ts < ?
            """,
            (period.start.timestamp(), period.end.timestamp()),
        ).fetchone()
        reasons = dict(
            conn.execute(
                "SELECT reason, COUNT(*) FROM requests WHERE ts >= ? AND ts < ? "
                "GROUP BY reason ORDER BY COUNT(*) DESC",
                (period.start.timestamp(), period.end.timestamp()),
            ).fetchall()
        )
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"cannot read the ledger at {db_path}: {exc}", EXIT_NO_DATABASE) from exc
    finally:
        conn.close()
    (total, local, api, failed, paid, counterfactual, unpriced, tax_ms, taxed) = row
    fixed = (Decimal(str(monthly_fixed_usd)) * period.month_fraction()).quantize(
        Decimal("0.000001"), rounding=ROUND_HALF_UP
    )
    saved = _usd(counterfactual - paid)
    answered = local + api
    return {
        "month": period.label,
        "from": period.start.date().isoformat(),
        "to": period.end.date().isoformat(),
        "requests": total,
        "local_requests": local,
        "api_requests": api,
        "failed_requests": failed,
        "unpriced_requests": unpriced,
        "api_cost_usd": str(_usd(paid)),
        "counterfactual_cost_usd": str(_usd(counterfactual)),
        "saved_usd": str(saved),
        "fixed_cost_usd": str(fixed),
        "net_saved_usd": str(saved - fixed),
        "local_share": round(local / answered, 4) if answered else 0.0,
        "latency_tax_s": round(tax_ms / 1000, 3),
        "latency_tax_requests": taxed,
        "reasons": reasons,
    }


def render(report: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=2)
    rows = [
        ("Month", report["month"]),
        ("Requests", f"{report['requests']:,}"),
        ("  answered locally", f"{report['local_requests']:,}"),
        ("  sent to the API", f"{report['api_requests']:,}"),
        ("  failed", f"{report['failed_requests']:,}"),
        ("Local share", f"{report['local_share'] * 100:.1f}%"),
        ("API cost (paid)", f"${Decimal(report['api_cost_usd']):,.4f}"),
        ("Without the proxy", f"${Decimal(report['counterfactual_cost_usd']):,.4f}"),
        ("Saved", f"${Decimal(report['saved_usd']):,.4f}"),
        ("Fixed cost (server)", f"${Decimal(report['fixed_cost_usd']):,.4f}"),
        ("Net saved", f"${Decimal(report['net_saved_usd']):,.4f}"),
        (
            "Latency tax",
            f"{report['latency_tax_s']:.1f} s on {report['latency_tax_requests']:,} requests",
        ),
    ]
    if report["unpriced_requests"]:
        rows.append(("Unpriced (no known price)", f"{report['unpriced_requests']:,} requests"))
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["metric", "value"])
        for key, value in report.items():
            if key != "reasons":
                writer.writerow([key, value])
        return out.getvalue().rstrip("\n")
    if fmt == "markdown":
        lines = ["| metric | value |", "|---|---:|"]
        lines += [f"| {label.strip()} | {value} |" for label, value in rows]
        return "\n".join(lines)
    width = max(len(label) for label, _ in rows)
    value_width = max(len(value) for _, value in rows)
    rule = "-" * (width + value_width + 3)
    lines = [rule]
    lines += [f"{label:<{width}}   {value:>{value_width}}" for label, value in rows]
    lines.append(rule)
    return "\n".join(lines)
