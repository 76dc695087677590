"""``frugal report``'s output: the table, markdown, CSV and JSON of a built report.

:func:`render` writes what :func:`proxy.ledger.reports.build.build` returned. Money arrives as exact
:class:`~decimal.Decimal` values (USD, to the micro-dollar) and leaves exact: JSON writes each
as a number token with its six decimals (``"saved_usd": 0.000010``), never as a string and
never through a float (the schema is in ``docs/report.md``); the table rounds to 1/100 of a
cent for display only. Names that clients chose (models, keys, reasons) are escaped in every
text format.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from proxy.logs import shown

# What a client chose (model names, key names, reasons) is escaped in every text format, so a
# ledger row cannot rewrite the terminal (ANSI escapes), forge lines (\r, \n, U+2028), break a
# markdown table (|) or run a formula in a spreadsheet (=, +, -, @ first: OWASP's CSV injection).
# JSON is left exact: json.dumps escapes control characters and every non-ASCII character.
_MARKDOWN_SPECIAL = frozenset("\\|<>[]`*")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def visible(text: str) -> str:
    """``text`` with every character that would not show as itself (controls, format and
    separator characters, blank letters such as U+3164...) as a Python escape
    (:func:`proxy.logs.shown`): a model or key name in a report cannot pass for another."""
    return shown(text)


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
        return dumps(report)
    if fmt == "csv":
        return _csv(report)
    markdown = fmt == "markdown"
    header, rows = _table_rows(report, markdown_cell if markdown else visible)
    summary = _summary_rows(report)
    quality = _quality_rows(report)
    groups = _quality_groups(report, markdown_cell if markdown else visible)
    if markdown:
        lines = [f"**frugal report: {title(report)}**", ""]
        lines += _markdown(header, rows)
        lines += [""] + _markdown(["Summary", ""], summary)
        if quality:
            lines += [""] + _markdown(["Quality (shadow audits)", ""], quality)
        if groups is not None:
            lines += [""] + _markdown(*groups)
        if report["warnings"]:
            lines += [""] + [f"- warning: {markdown_cell(w)}" for w in report["warnings"]]
        return "\n".join(lines)
    lines = [f"frugal report: {title(report)}"]
    lines += _box(header, rows, total_row=len(rows) > 1)
    lines += _box(None, summary)
    if quality:
        lines += _box(None, quality)
    if groups is not None:
        lines += _box(*groups)
    lines += [f"warning: {visible(w)}" for w in report["warnings"]]
    return "\n".join(lines)


def title(report: dict[str, Any]) -> str:
    return f"{report['month']} ({report['from']} to {report['to']}, UTC)"


def dumps(value: Any, indent: int = 2) -> str:
    """JSON as ``json.dumps(value, indent=indent)`` writes it, except that a :class:`Decimal`
    is written as the number its text says, exactly (``Decimal("0.000010")`` → ``0.000010``)."""
    return _dumps(value, indent, 0)


def _dumps(value: Any, indent: int, depth: int) -> str:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} has no JSON number")
        return format(value, "f")
    inner, outer = "\n" + " " * (indent * (depth + 1)), "\n" + " " * (indent * depth)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = (f"{json.dumps(str(k))}: {_dumps(v, indent, depth + 1)}" for k, v in value.items())
        return "{" + inner + ("," + inner).join(items) + outer + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        parts = (_dumps(v, indent, depth + 1) for v in value)
        return "[" + inner + ("," + inner).join(parts) + outer + "]"
    return json.dumps(value)


def usd(text: str | Decimal, places: int = 4) -> str:
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
    if by is None or "groups" not in report:  # --by kind groups the quality section only
        return ["Period", *_COLUMNS], [_cells(report["month"], report)]
    rows = [_cells(escape(_group_name(by, g)), g) for g in report["groups"]]
    rows.append(_cells("Total", report))
    header = [by.capitalize(), *_COLUMNS]
    if any("monthly_budget_usd" in g for g in report["groups"]):  # --by key, with budgets
        header += ["Budget", "Budget used"]
        for row, group in zip(rows, [*report["groups"], {}], strict=True):
            row += _budget_cells(group)
    return header, rows


def _budget_cells(group: dict[str, Any]) -> list[str]:
    """A key's monthly budget and its use (``$3.1000 (15.5%) in 2026-10``); blank without."""
    if "monthly_budget_usd" not in group:
        return ["", ""]
    share = group["budget_used_share"]
    used = usd(group["budget_spent_usd"]) + (f" ({pct(share)})" if share is not None else "")
    return [usd(group["monthly_budget_usd"], 2), f"{used} in {group['budget_month']}"]


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
    deferred = report.get("deferred") or {}
    if deferred.get("requests"):
        rows.append(["Deferred work", _deferred(deferred)])
    if report["failed_requests"]:
        rows.append(["Failed requests", f"{report['failed_requests']:,}"])
    if report["unpriced_requests"]:
        rows.append(
            ["Not costed", f"{plural(report['unpriced_requests'], 'request')} (see warnings)"]
        )
    if report.get("gate"):
        rows.append(["Quality gate", visible(str(report["gate"]["detail"]))])
    return rows


def _deferred(deferred: dict[str, Any]) -> str:
    """Deferred work on one line: its requests by tier, local share, paid, saved of what it
    would have cost (at its tier's rate)."""
    tiers = ", ".join(f"{visible(t)} {n:,}" for t, n in deferred["tiers"].items())
    return (
        f"{plural(deferred['requests'], 'request')} ({tiers}), {pct(deferred['local_share'])} "
        f"local, paid {usd(deferred['api_cost_usd'])}, saved {usd(deferred['saved_usd'])} of "
        f"{usd(deferred['counterfactual_cost_usd'])}"
    )


def _precision(group: dict[str, Any]) -> str:
    if group.get("audited_precision") is None:
        return "no judged accepted answer"
    low, high = group["audited_precision_ci"]
    return f"{pct(group['audited_precision'])} (95%: {pct(low)} to {pct(high)})"


def _quality_rows(report: dict[str, Any]) -> list[list[str]]:
    """The quality section: what the audits say, what they cost, the threshold in force; none
    while there is no audit and no target precision."""
    if not (report.get("audits") or report.get("target_precision")):
        return []
    rejected = report.get("rejected_but_correct_share")
    rows = [
        ["Audits", f"{report['audits']:,} ({report['audits_failed']:,} without a verdict)"],
        ["Audited precision (accepted)", _precision(report)],
        [
            "Rejected but correct",
            "no judged rejected answer" if rejected is None else pct(rejected),
        ],
        ["Audit spend (in Paid)", usd(report["audit_cost_usd"])],
        [
            "Threshold in force",
            f"{report['threshold_in_force']:g} ({report['threshold_source']})",
        ],
        ["Why", visible(str(report["threshold_why"]))],
    ]
    return rows


def _quality_groups(
    report: dict[str, Any], escape: Callable[[str], str]
) -> tuple[list[str], list[list[str]]] | None:
    by = report.get("by")
    if by not in ("kind", "model") or "quality_groups" not in report:
        return None
    rows = []
    for g in report["quality_groups"]:
        rejected = g["rejected_but_correct_share"]
        rows.append(
            [
                escape(str(g[by])),
                f"{g['audits']:,}",
                _precision(g),
                "-" if rejected is None else pct(rejected),
            ]
        )
    if not rows:
        return None
    return [by.capitalize(), "Audits", "Audited precision", "Rejected but correct"], rows


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
    if by is not None and "groups" in report:
        for group in report["groups"]:
            name = "" if group[by] is None else csv_cell(str(group[by]))
            writer.writerow([*span, name, *(group.get(f, "") for f in _CSV_FIELDS)])
    label = "total" if by and "groups" in report else report["month"]
    writer.writerow([*span, label, *(report[f] for f in _CSV_FIELDS)])
    return out.getvalue().rstrip("\n")
