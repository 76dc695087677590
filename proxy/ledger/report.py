"""``frugal report``: what a period cost, and what it would have cost on the API.

Money is summed as integers (pico-dollars) by SQLite and in Python, and becomes a Decimal only
for display, so the totals equal the sum of the rows exactly (shown to the micro-dollar in
JSON, CSV and markdown, to 1/100 of a cent in the table). Every grouping, and the totals, are
read from the daily rollup ``requests_daily`` (per UTC day, model, client key, reason, route and
outcome; triggers keep it equal to the sum of the rows); the p95 of the latency tax is a sorted
query on the partial index of the taxed rows.

- counterfactual: what every answered request would have cost on the API (the requested model's
  price, see :func:`proxy.ledger.pricing.apply_costs`); paid: what the API calls cost; saved: the
  difference; fixed: ``[costs] monthly_fixed_usd`` prorated over the period, each calendar
  month by the share of its seconds the period covers, up to now; net: saved − fixed.
- latency tax: the time spent on local attempts whose answer was not used, its share of the
  answered requests, and its p95 (nearest rank) over the requests that paid it.
- rows that could not be costed (an unpriced model, or an API call that reported no usage) are
  counted, left out of the money, and named in ``warnings``.

Exit codes (the CLI returns them): 0 a report; 2 a bad option or config; 3 no ledger (no file,
or not a readable ledger); 4 the ledger has no request in the period (the zero report is still
printed, and a message goes to stderr).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sqlite3
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

from proxy.errors import ConfigError
from proxy.ledger.pricing import PICO

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_DATABASE = 3
EXIT_EMPTY = 4

GROUPINGS = ("model", "day", "key", "reason")
FORMATS = ("table", "json", "csv", "markdown")
_DAY = timedelta(days=1)
_MICRO = Decimal("0.000001")


class ReportError(Exception):
    """A report that cannot be produced; carries the CLI exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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
            except ValueError:
                raise ReportError(
                    f"--month {text!r}: expected YYYY-MM, e.g. 2026-11", EXIT_USAGE
                ) from None
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


# -- the numbers ------------------------------------------------------------------------------


@dataclass
class Totals:
    requests: int = 0
    local: int = 0
    api: int = 0
    failed: int = 0
    paid: int = 0  # pico-dollars
    counterfactual: int = 0
    uncosted: int = 0
    tax_ms: float = 0.0
    taxed: int = 0
    fixed: int | None = None  # pico-dollars, where the fixed cost can be attributed
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, other: Totals) -> None:
        self.requests += other.requests
        self.local += other.local
        self.api += other.api
        self.failed += other.failed
        self.paid += other.paid
        self.counterfactual += other.counterfactual
        self.uncosted += other.uncosted
        self.tax_ms += other.tax_ms
        self.taxed += other.taxed
        for reason, n in other.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + n

    @property
    def saved(self) -> int:
        return self.counterfactual - self.paid

    @property
    def answered(self) -> int:
        return self.local + self.api

    @property
    def local_share(self) -> float:
        return round(self.local / self.answered, 4) if self.answered else 0.0

    @property
    def tax_share(self) -> float:
        return round(self.taxed / self.answered, 4) if self.answered else 0.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "local_requests": self.local,
            "api_requests": self.api,
            "failed_requests": self.failed,
            "unpriced_requests": self.uncosted,
            "local_share": self.local_share,
            "api_cost_usd": money(self.paid),
            "counterfactual_cost_usd": money(self.counterfactual),
            "saved_usd": money(self.saved),
        }
        if self.fixed is not None:
            out["fixed_cost_usd"] = money(self.fixed)
            out["net_saved_usd"] = money(self.saved - self.fixed)
        out["latency_tax_s"] = round(self.tax_ms / 1000, 3)
        out["latency_tax_requests"] = self.taxed
        out["latency_tax_share"] = self.tax_share
        return out


def money(pico: int) -> str:
    """Pico-dollars as exact decimal USD text, rounded half-even to the micro-dollar."""
    return str((Decimal(pico) / PICO).quantize(_MICRO, rounding=ROUND_HALF_EVEN))


# Every grouping reads the daily rollup (migrations 0002 and 0005: per UTC day, model, client
# key, reason, route and outcome), kept equal to the sum of the rows by triggers: a few thousand
# rows a month, however many requests there were.
_ROLLUP_GROUP = {
    None: "NULL",
    "model": "model",
    "day": "day",
    "key": "key_name",
    "reason": "reason",
}
_ROLLUP = """
SELECT {group} AS grp, reason,
       SUM(requests),
       SUM(CASE WHEN route = 'local' THEN requests ELSE 0 END),
       SUM(CASE WHEN route = 'api' THEN requests ELSE 0 END),
       SUM(CASE WHEN failed THEN requests ELSE 0 END),
       SUM(api_cost_pusd),
       SUM(counterfactual_cost_pusd),
       SUM(uncosted),
       SUM(latency_tax_ms),
       SUM(taxed)
FROM requests_daily
WHERE day >= ? AND day < ?
GROUP BY grp, reason
"""


def _connect(db_path: str) -> sqlite3.Connection:
    """Open the ledger for reading, upgrading it first if an older proxy wrote it."""
    from proxy.ledger.migrate import applied_migrations, migration_files, open_database

    path = Path(db_path)
    if not path.is_file():
        raise ReportError(
            f"no ledger database at {db_path}: the proxy has not recorded any request yet "
            "(or [ledger] path / --db points elsewhere)",
            EXIT_NO_DATABASE,
        )
    try:
        conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True, timeout=5)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            current = "_migrations" in tables and applied_migrations(conn) >= {
                name for name, _ in migration_files()
            }
        except sqlite3.DatabaseError:
            conn.close()
            raise
        if not current:
            conn.close()
            open_database(str(path))
            conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True, timeout=5)
    except (sqlite3.DatabaseError, ConfigError) as exc:
        raise ReportError(f"cannot read the ledger at {db_path}: {exc}", EXIT_NO_DATABASE) from exc
    return conn


def build(
    db_path: str,
    period: Period,
    monthly_fixed_usd: float | Decimal,
    *,
    by: str | None = None,
    daily: bool = False,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The report as a dict (what ``--format json`` prints). ``daily`` adds the per-day series
    the chart draws, whatever ``by`` is."""
    if by is not None and by not in GROUPINGS:
        raise ReportError(f"--by {by!r}: expected one of {', '.join(GROUPINGS)}", EXIT_USAGE)
    now = now or datetime.now(UTC)
    monthly_pico = int(Decimal(str(monthly_fixed_usd)) * PICO)
    conn = _connect(db_path)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
        bounds = (period.start.timestamp(), period.end.timestamp())
        days_range = (int(bounds[0]) // 86400, int(bounds[1]) // 86400)
        groups = _aggregate(conn, _ROLLUP.format(group=_ROLLUP_GROUP[by]), days_range)
        days = None
        if by == "day":
            days = groups
        elif daily:
            days = _aggregate(conn, _ROLLUP.format(group="day"), days_range)
        total = Totals()
        for totals in groups.values():
            total.add(totals)
        p95 = _p95(conn, bounds, total.taxed)
        prediction = _prediction_error(conn, bounds) if "actual_local_ms" in columns else None
        warnings = _warnings(conn, days_range) if total.uncosted else []
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"cannot read the ledger at {db_path}: {exc}", EXIT_NO_DATABASE) from exc
    finally:
        conn.close()

    total.fixed = fixed_cost_pico(period.start, period.end, monthly_pico, now)
    report: dict[str, Any] = {
        "month": period.label,
        "from": period.start.date().isoformat(),
        "to": period.last_day.isoformat(),
        **total.as_dict(),
        "latency_tax_p95_s": p95,
        "reasons": dict(sorted(total.reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "warnings": warnings,
    }
    if prediction is not None:  # only when the period has predicted local answers
        report["prediction_mdape"], report["prediction_samples"] = prediction
    if by is not None:
        report["by"] = by
        report["groups"] = _group_list(by, groups, period, monthly_pico, now)
    if days is not None:
        report["days"] = _group_list("day", days, period, monthly_pico, now)
    return report


def _aggregate(conn: sqlite3.Connection, query: str, days: tuple[int, int]) -> dict[Any, Totals]:
    groups: dict[Any, Totals] = {}
    for row in conn.execute(query, days):
        key, reason, n, local, api, failed, paid, cf, uncosted, tax_ms, taxed = row
        part = Totals(
            requests=n,
            local=local or 0,
            api=api or 0,
            failed=failed or 0,
            paid=paid or 0,
            counterfactual=cf or 0,
            uncosted=uncosted or 0,
            tax_ms=tax_ms or 0.0,
            taxed=taxed or 0,
            reasons={reason: n},
        )
        groups.setdefault(key if key != "" else None, Totals()).add(part)
    return groups


def _p95(conn: sqlite3.Connection, bounds: tuple[float, float], taxed: int) -> float:
    if not taxed:
        return 0.0
    rank = math.ceil(0.95 * taxed)
    row = conn.execute(
        "SELECT latency_tax_ms FROM requests WHERE ts >= ? AND ts < ? AND latency_tax_ms > 0 "
        "ORDER BY latency_tax_ms LIMIT 1 OFFSET ?",
        (*bounds, rank - 1),
    ).fetchone()
    return round(row[0] / 1000, 3) if row else 0.0


def _prediction_error(
    conn: sqlite3.Connection, bounds: tuple[float, float]
) -> tuple[float, int] | None:
    """Median absolute percentage error of the predicted local times (issue 6), over the local
    answers that ran to their end where predicted; None when there are none."""
    errors = sorted(
        abs(predicted - actual) / actual
        for predicted, actual in conn.execute(
            "SELECT predicted_local_ms, actual_local_ms FROM requests WHERE ts >= ? AND ts < ? "
            "AND predicted_local_ms IS NOT NULL AND actual_local_ms IS NOT NULL "
            "AND actual_local_ms > 0",
            bounds,
        )
    )
    if not errors:
        return None
    mid = len(errors) // 2
    median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    return round(median, 4), len(errors)


def _warnings(conn: sqlite3.Connection, days: tuple[int, int]) -> list[str]:
    out = []
    rows = conn.execute(
        "SELECT model, SUM(uncosted) - SUM(uncounted), SUM(uncounted) FROM requests_daily "
        "WHERE day >= ? AND day < ? GROUP BY model HAVING SUM(uncosted) > 0 "
        "ORDER BY 2 DESC, model",
        days,
    ).fetchall()
    no_usage = 0
    for model, unpriced, uncounted in rows:
        no_usage += uncounted
        if unpriced:
            out.append(
                f"{plural(unpriced, 'request')} for '{model}' not costed: no known price. "
                f'Add [pricing."{model}"] to the config to price new requests.'
            )
    if no_usage:
        out.append(
            f"{plural(no_usage, 'request')} not costed: the API reported no token usage "
            "(e.g. a stream cut mid-way)."
        )
    return out


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


# -- rendering --------------------------------------------------------------------------------


# What a client chose (model names, key names, reasons) is escaped in every text format, so a
# ledger row cannot rewrite the terminal (ANSI escapes), forge lines (\r, \n, U+2028), break a
# markdown table (|) or run a formula in a spreadsheet (=, +, -, @ first: OWASP's CSV injection).
# JSON is left exact: json.dumps escapes control characters and every non-ASCII character.
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_MARKDOWN_SPECIAL = frozenset("\\|<>[]`*")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def visible(text: str) -> str:
    """``text`` with control, format and line-separator characters as Python escapes."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if unicodedata.category(char) not in _INVISIBLE:
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return "".join(out)


def markdown_cell(text: str) -> str:
    """A visible ``text`` whose markdown punctuation is backslash-escaped (no cell breaks)."""
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in visible(text))


def csv_cell(text: str) -> str:
    """A visible ``text`` that a spreadsheet cannot take for a formula."""
    if text.startswith(_FORMULA_START):
        text = "'" + text
    return visible(text)


def render(report: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=2)
    if fmt == "csv":
        return _csv(report)
    markdown = fmt == "markdown"
    header, rows = _table_rows(report, markdown_cell if markdown else visible)
    summary = _summary_rows(report)
    if markdown:
        lines = [f"**frugal report: {title(report)}**", ""]
        lines += _markdown(header, rows)
        lines += [""] + _markdown(["Summary", ""], summary)
        if report["warnings"]:
            lines += [""] + [f"- warning: {markdown_cell(w)}" for w in report["warnings"]]
        return "\n".join(lines)
    lines = [f"frugal report: {title(report)}"]
    lines += _box(header, rows, total_row=len(rows) > 1)
    lines += _box(None, summary)
    lines += [f"warning: {visible(w)}" for w in report["warnings"]]
    return "\n".join(lines)


def title(report: dict[str, Any]) -> str:
    return f"{report['month']} ({report['from']} to {report['to']}, UTC)"


def usd(text: str, places: int = 4) -> str:
    value = Decimal(text).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
    sign = "-" if value < 0 else ""
    return f"{sign}${abs(value):,.{places}f}"


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def pct(share: float) -> str:
    return f"{share * 100:.1f}%"


_COLUMNS = ["Requests", "Local", "Local share", "Paid (API)", "Without proxy", "Saved", "Tax"]


def _cells(name: str, g: dict[str, Any]) -> list[str]:
    return [
        name,
        f"{g['requests']:,}",
        f"{g['local_requests']:,}",
        pct(g["local_share"]),
        usd(g["api_cost_usd"]),
        usd(g["counterfactual_cost_usd"]),
        usd(g["saved_usd"]),
        f"{g['latency_tax_s']:,.1f} s",
    ]


def _table_rows(
    report: dict[str, Any], escape: Callable[[str], str]
) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows; ``escape`` is applied to the group names (client data)."""
    by = report.get("by")
    if by is None:
        return ["Period", *_COLUMNS], [_cells(report["month"], report)]
    rows = [_cells(escape(_group_name(by, g)), g) for g in report["groups"]]
    rows.append(_cells("Total", report))
    return [by.capitalize(), *_COLUMNS], rows


def _group_name(by: str, group: dict[str, Any]) -> str:
    value = group[by]
    if value is None:
        return "(no key)" if by == "key" else "(none)"
    return str(value)


def _summary_rows(report: dict[str, Any]) -> list[list[str]]:
    tax = (
        f"{report['latency_tax_s']:,.1f} s on {plural(report['latency_tax_requests'], 'request')} "
        f"({pct(report['latency_tax_share'])}), p95 {report['latency_tax_p95_s']:.2f} s"
    )
    rows = [
        ["Without the proxy", usd(report["counterfactual_cost_usd"])],
        ["Paid to the API", usd(report["api_cost_usd"])],
        ["Saved", usd(report["saved_usd"])],
        ["Fixed cost (server)", usd(report["fixed_cost_usd"])],
        ["Net saved", usd(report["net_saved_usd"])],
        ["Local share", pct(report["local_share"])],
        ["Latency tax", tax],
    ]
    if report.get("prediction_samples"):
        rows.append(
            [
                "Prediction error (MdAPE)",
                f"{pct(report['prediction_mdape'])} over "
                f"{plural(report['prediction_samples'], 'local answer')}",
            ]
        )
    if report["failed_requests"]:
        rows.append(["Failed requests", f"{report['failed_requests']:,}"])
    if report["unpriced_requests"]:
        rows.append(
            ["Not costed", f"{plural(report['unpriced_requests'], 'request')} (see warnings)"]
        )
    return rows


def _box(header: list[str] | None, rows: list[list[str]], *, total_row: bool = False) -> list[str]:
    table = ([header] if header else []) + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "│ " + " │ ".join(parts) + " │"

    def rule(left: str, mid: str, right: str) -> str:
        return left + mid.join("─" * (w + 2) for w in widths) + right

    out = [rule("┌", "┬", "┐")]
    if header:
        out += [line(header), rule("├", "┼", "┤")]
    for i, row in enumerate(rows):
        if total_row and i == len(rows) - 1:
            out.append(rule("├", "┼", "┤"))
        out.append(line(row))
    out.append(rule("└", "┴", "┘"))
    return out


def _markdown(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


_CSV_FIELDS = [
    "requests",
    "local_requests",
    "api_requests",
    "failed_requests",
    "unpriced_requests",
    "local_share",
    "api_cost_usd",
    "counterfactual_cost_usd",
    "saved_usd",
    "fixed_cost_usd",
    "net_saved_usd",
    "latency_tax_s",
    "latency_tax_requests",
    "latency_tax_share",
]


def _csv(report: dict[str, Any]) -> str:
    by = report.get("by")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["from", "to", by or "period", *_CSV_FIELDS])
    span = [report["from"], report["to"]]
    if by is not None:
        for group in report["groups"]:
            name = "" if group[by] is None else csv_cell(str(group[by]))
            writer.writerow([*span, name, *(group.get(f, "") for f in _CSV_FIELDS)])
    writer.writerow([*span, "total" if by else report["month"], *(report[f] for f in _CSV_FIELDS)])
    return out.getvalue().rstrip("\n")
