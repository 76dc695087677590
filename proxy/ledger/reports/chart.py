"""``frugal report --chart FILE``: the daily savings and the local share, as PNG or SVG.

matplotlib is an optional dependency (``pip install 'frugal-proxy[chart]'``), imported only
here and only when a chart is asked for; the figure is drawn without pyplot's global state.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from proxy.ledger.reports.build import EXIT_USAGE, ReportError
from proxy.ledger.reports.formats import pct, title, usd

CHART_SUFFIXES = (".png", ".svg")


def check_path(path: str) -> None:
    if not path.lower().endswith(CHART_SUFFIXES):
        raise ReportError(
            f"--chart {path!r}: expected a file name ending in .png or .svg", EXIT_USAGE
        )
    folder = Path(path).parent
    if not folder.is_dir():
        raise ReportError(f"--chart {path!r}: the folder {folder} does not exist", EXIT_USAGE)


def draw(report: dict[str, Any], path: str) -> None:
    """Daily savings (bars, USD) against the daily fixed cost, and the local share (line)."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError(
            "--chart needs matplotlib: pip install 'frugal-proxy[chart]'", EXIT_USAGE
        ) from None
    days = report["days"]
    x = list(range(len(days)))
    saved = [float(Decimal(d["saved_usd"])) for d in days]  # for drawing only
    fixed = [float(Decimal(d["fixed_cost_usd"])) for d in days]
    style: dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": "frugal", "font.size": 9}
    with matplotlib.rc_context(style):  # type: ignore[arg-type]
        fig = Figure(figsize=(10, 4.8), layout="constrained")
        ax = fig.subplots()
        bars = ax.bar(
            x, saved, color=["#2e7d32" if s >= 0 else "#c62828" for s in saved], label="saved"
        )
        for bar, day in zip(bars, days, strict=True):
            bar.set_gid(f"saved-{day['day']}")
        if any(fixed):
            (line,) = ax.step(
                x, fixed, where="mid", color="#555555", linestyle="--", label="fixed cost per day"
            )
            line.set_gid("fixed-cost")
        ax.set_ylabel("USD per day")
        ax.axhline(0, color="#999999", linewidth=0.8)
        share_ax = ax.twinx()
        answered = [(i, d["local_share"] * 100) for i, d in enumerate(days) if d["requests"]]
        (share,) = share_ax.plot(
            [i for i, _ in answered],
            [s for _, s in answered],
            color="#1565c0",
            marker="o",
            markersize=3,
            label="local share",
        )
        share.set_gid("local-share")
        share_ax.set_ylim(0, 100)
        share_ax.set_ylabel("local share (%)")
        step = max(1, len(days) // 15)
        ax.set_xticks(x[::step], [d["day"][5:] for d in days][::step])
        ax.set_title(
            f"frugal-proxy, {title(report)}: saved {usd(report['saved_usd'], 2)}, "
            f"net {usd(report['net_saved_usd'], 2)}, local share {pct(report['local_share'])}"
        )
        handles = [*ax.get_legend_handles_labels()[0], share]
        ax.legend(handles=handles, loc="upper left", frameon=False)
        metadata = {"Date": None} if path.lower().endswith(".svg") else {}
        try:
            fig.savefig(path, metadata=metadata)
        except OSError as exc:
            raise ReportError(f"--chart {path!r}: cannot write it ({exc})", EXIT_USAGE) from exc
