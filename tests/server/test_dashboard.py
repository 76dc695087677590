"""``GET /v1/frugal/report`` and ``GET /dashboard`` in-process, on a seeded ledger.

The endpoint is checked against the real CLI on the same ledger and the same config file, on
SQLite and on PostgreSQL; the page's files for what they may and may not contain. The page in a
real browser is ``tests/server/test_dashboard_browser.py``.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from proxy import cli, config
from proxy.ledger.db.location import Database
from proxy.ledger.reports import build as report_mod
from proxy.server import dashboard as dashboard_mod
from tests.dashboard_support import EMPTY_MONTH, GOOD_MONTH, LOSING_MONTH, seed

KEYS_ENV = "FRUGAL_TEST_DASHBOARD_KEYS"
ALICE = "sk-dashboard-alice-0123456789abcdef"


def write_config(tmp_path: Path, ledger: str, *, keys: bool = False) -> Path:
    """One config file, read by the app and by ``frugal report --config`` alike."""
    where = f'url = "{ledger}"' if "://" in ledger else f'path = "{ledger}"'
    path = tmp_path / "frugal.toml"
    path.write_text(
        f"""
[server]
api_keys_env = "{KEYS_ENV if keys else ""}"

[local]
n_threads = 1

[fallback]
api_base = ""
api_key_env = ""

[audit]
rate = 0

[quality]
threshold = 0.55

[ledger]
{where}

[costs]
monthly_fixed_usd = 40
"""
    )
    return path


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    db = tmp_path / "ledger.db"
    seed(db)
    return write_config(tmp_path, str(db))


def cli_report(capsys: pytest.CaptureFixture[str], cfg: Path, *args: str) -> tuple[int, str]:
    capsys.readouterr()  # what a running app logged so far is not the report
    code = cli.main(["report", "--config", str(cfg), "--format", "json", *args])
    out, _ = capsys.readouterr()
    return code, out


async def get(client: httpx.AsyncClient, path: str, **kw: Any) -> httpx.Response:
    return await client.get(path, **kw)


# -- the endpoint is the CLI's report --------------------------------------------------------


@pytest.mark.parametrize("by", [None, "day", "model", "key", "reason", "kind"])
async def test_the_endpoint_returns_what_the_cli_prints(
    make_client: Callable[..., Any], seeded: Path, capsys: pytest.CaptureFixture[str], by: str
) -> None:
    args = ["--month", GOOD_MONTH, *(["--by", by] if by else [])]
    code, printed = cli_report(capsys, seeded, *args)
    assert code == 0
    query = f"?month={GOOD_MONTH}" + (f"&by={by}" if by else "")
    async with make_client(config.load(str(seeded))) as client:
        response = await get(client, "/v1/frugal/report" + query)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    # The same text, byte for byte: money as the same six-decimal numbers, keys in one order.
    assert response.text == printed.rstrip("\n")
    assert '"net_saved_usd": 32.608657' in response.text  # the seeded month's net, exact
    assert '"threshold_in_force": 0.55,' in response.text  # [quality] threshold, on both


async def test_the_endpoint_and_the_cli_agree_on_postgresql(
    make_client: Callable[..., Any],
    database: Database,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed(database)
    cfg = write_config(tmp_path, database.url if database.is_postgres else database.path)
    async with make_client(config.load(str(cfg))) as client:
        for by in ("day", "key"):
            code, printed = cli_report(capsys, cfg, "--month", GOOD_MONTH, "--by", by)
            assert code == 0
            response = await get(client, f"/v1/frugal/report?month={GOOD_MONTH}&by={by}")
            assert response.status_code == 200
            assert response.text == printed.rstrip("\n")


async def test_without_a_month_it_is_this_month_so_far(
    make_client: Callable[..., Any], seeded: Path
) -> None:
    async with make_client(config.load(str(seeded))) as client:
        body = (await get(client, "/v1/frugal/report")).json()
    assert body["month"] == report_mod.Period.month(None).label
    assert body["requests"] > 0  # the seed writes a few requests this month


async def test_an_empty_month_is_an_empty_report_not_an_error(
    make_client: Callable[..., Any], seeded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, printed = cli_report(capsys, seeded, "--month", EMPTY_MONTH, "--by", "day")
    assert code == report_mod.EXIT_EMPTY  # the CLI's exit code tells scripts; the body is a report
    async with make_client(config.load(str(seeded))) as client:
        response = await get(client, f"/v1/frugal/report?month={EMPTY_MONTH}&by=day")
    assert response.status_code == 200
    assert response.text == printed.rstrip("\n")
    body = response.json()
    assert body["requests"] == 0 and body["reasons"] == {} and body["warnings"] == []
    assert body["saved_usd"] == 0 and body["net_saved_usd"] == -40  # the server still costs
    assert [d["requests"] for d in body["groups"]] == [0] * 30


@pytest.mark.parametrize(
    "month",
    ["2026-13", "2026-00", "2026-1", "26-10", "2026-10-01", "october", "", "2026/10", "0000-01"]
    + ["9999-12"],  # years with no datetime: a 400 too, not a 500
)
async def test_a_bad_month_is_a_400_that_names_month(
    make_client: Callable[..., Any], seeded: Path, month: str
) -> None:
    async with make_client(config.load(str(seeded))) as client:
        response = await get(client, "/v1/frugal/report", params={"month": month})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "month"
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_value"
    assert error["message"] == (
        f"Invalid 'month': {month!r}. Expected YYYY-MM with a month from 01 to 12, e.g. 2026-11."
    )


async def test_the_endpoint_is_in_openapi_and_its_answers_fit_the_schema(
    make_client: Callable[..., Any], seeded: Path
) -> None:
    async with make_client(config.load(str(seeded))) as client:
        spec = (await get(client, "/openapi.json")).json()
        bodies = [
            (await get(client, f"/v1/frugal/report?month={month}" + (f"&by={by}" if by else "")))
            for month in (GOOD_MONTH, EMPTY_MONTH)
            for by in (None, *report_mod.GROUPINGS)
        ]
    operation = spec["paths"]["/v1/frugal/report"]["get"]
    assert {p["name"]: p["in"] for p in operation["parameters"]} == {
        "month": "query",
        "by": "query",
    }
    assert set(operation["responses"]) == {"200", "400", "401", "503"}
    schema = spec["components"]["schemas"]["Report"]
    for response in bodies:
        assert response.status_code == 200
        jsonschema.validate(response.json(), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**bodies[0].json(), "saved_usd": "72.609549"}, schema)


async def test_a_bad_grouping_is_a_400_that_names_by(
    make_client: Callable[..., Any], seeded: Path
) -> None:
    async with make_client(config.load(str(seeded))) as client:
        response = await get(client, f"/v1/frugal/report?month={GOOD_MONTH}&by=week")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "by" and "'week'" in error["message"]
    assert "model, day, key, reason, kind" in error["message"]


async def test_the_report_needs_a_key_when_the_proxy_has_keys(
    make_client: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "ledger.db"
    seed(db)
    monkeypatch.setenv(KEYS_ENV, f"alice:{ALICE}")
    settings = config.load(str(write_config(tmp_path, str(db), keys=True)))
    path = f"/v1/frugal/report?month={LOSING_MONTH}"
    async with make_client(settings) as client:
        missing = await get(client, path)
        wrong = await get(client, path, headers={"authorization": "Bearer sk-not-a-key-of-ours"})
        right = await get(client, path, headers={"authorization": f"Bearer {ALICE}"})
        page = await get(client, "/dashboard")  # the page holds no data: it is open
        asset = await get(client, "/dashboard/dashboard.js")
    for refused in (missing, wrong):
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        assert "net_saved_usd" not in refused.text
    assert right.status_code == 200 and right.json()["month"] == LOSING_MONTH
    assert page.status_code == 200 and asset.status_code == 200


OPS = "sk-dashboard-ops-0123456789abcdef"


def ledger_sums(db: Path, month: str, key: str | None) -> tuple[int, int, set[str]]:
    """(requests, API pico-dollars, models) of the month's rows, of one key or of all, read
    straight from the rows, not from the rollup the report reads."""
    import sqlite3
    from datetime import datetime

    start = datetime.fromisoformat(month + "-01T00:00:00+00:00")
    end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    where = "ts >= ? AND ts < ?" + (" AND key_name = ?" if key else "")
    params: tuple[Any, ...] = (start.timestamp(), end.timestamp(), *([key] if key else []))
    with sqlite3.connect(db) as conn:
        n, paid = conn.execute(
            f"SELECT COUNT(*), COALESCE(SUM(api_cost_pusd), 0) FROM requests WHERE {where}",
            params,
        ).fetchone()
        models = {
            m
            for (m,) in conn.execute(
                f"SELECT DISTINCT requested_model FROM requests WHERE {where}", params
            )
        }
    return int(n), int(paid), {m for m in models if m}


@pytest.mark.parametrize("by", [None, "model", "key", "reason", "day"])
async def test_a_client_key_reads_only_its_own_figures_and_an_admin_every_keys(
    make_client: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    """Issue 24, scopes: the seeded month has the keys ci, alice, batch-jobs and none."""
    from decimal import Decimal

    db = tmp_path / "ledger.db"
    seed(db)
    monkeypatch.setenv(KEYS_ENV, f"alice:{ALICE},ops;admin:{OPS}")
    settings = config.load(str(write_config(tmp_path, str(db), keys=True)))
    path = f"/v1/frugal/report?month={GOOD_MONTH}" + (f"&by={by}" if by else "")
    async with make_client(settings) as client:
        own = await get(client, path, headers={"authorization": f"Bearer {ALICE}"})
        every = await get(client, path, headers={"authorization": f"Bearer {OPS}"})
    assert own.status_code == 200 and every.status_code == 200
    mine, everyone = own.json(), every.json()
    requests, paid, models = ledger_sums(db, GOOD_MONTH, "alice")
    all_requests, all_paid, _ = ledger_sums(db, GOOD_MONTH, None)
    assert 0 < requests < all_requests
    assert mine["requests"] == requests and everyone["requests"] == all_requests
    assert Decimal(str(mine["api_cost_usd"])) == (Decimal(paid) / 10**12).quantize(Decimal("1e-6"))
    assert Decimal(str(everyone["api_cost_usd"])) > Decimal(all_paid) / 10**12  # + the audits
    assert "batch-jobs" not in own.text and '"ci"' not in own.text
    assert mine["audits"] == 0 and mine["fixed_cost_usd"] == 0  # the server's, not the key's
    if by == "key":
        assert [g["key"] for g in mine["groups"]] == ["alice"]
        assert {g["key"] for g in everyone["groups"]} == {"ci", "alice", "batch-jobs", None}
    if by == "model":
        assert {g["model"] for g in mine["groups"]} == models
    if by is not None:
        assert sum(g["requests"] for g in mine["groups"]) == requests


async def test_the_report_is_built_off_the_event_loop(
    make_client: Callable[..., Any], seeded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a report is being built, the proxy still answers: /healthz gets through."""
    release = threading.Event()
    real_build = report_mod.build

    def held_build(*args: Any, **kw: Any) -> dict[str, Any]:
        assert release.wait(30), "the test never released the report"
        return real_build(*args, **kw)

    monkeypatch.setattr(report_mod, "build", held_build)
    async with make_client(config.load(str(seeded))) as client:
        pending = asyncio.create_task(get(client, f"/v1/frugal/report?month={GOOD_MONTH}"))
        await asyncio.sleep(0.2)
        assert not pending.done()
        health = await asyncio.wait_for(get(client, "/healthz"), 20)
        assert health.status_code == 200 and not pending.done()
        release.set()
        response = await pending
    assert response.status_code == 200 and response.json()["requests"] > 0


# -- the page and its files ------------------------------------------------------------------


async def test_the_page_and_its_files_carry_the_security_headers(
    make_client: Callable[..., Any], seeded: Path
) -> None:
    async with make_client(config.load(str(seeded))) as client:
        page = await get(client, "/dashboard")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        linked = re.findall(r'(?:src|href)="(dashboard/[^"]+)"', page.text)
        assert set(linked) == {f"dashboard/{name}" for name in dashboard_mod.FILES} - {
            "dashboard/dashboard.html"
        }
        files = {name: await get(client, "/" + name) for name in sorted(set(linked))}
    for response in (page, *files.values()):
        assert response.status_code == 200
        policy = response.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self';" in policy
        assert "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
    types = {name.rpartition(".")[2]: r.headers["content-type"] for name, r in files.items()}
    assert types["js"] == "text/javascript; charset=utf-8"
    assert types["css"] == "text/css; charset=utf-8"
    assert "MIT License" in files["dashboard/uPlot.LICENSE.txt"].text


def test_the_page_has_no_inline_script_or_style_and_no_markup_from_data() -> None:
    """The policy forbids inline script and style; the scripts write data as text only."""
    static = Path(dashboard_mod.__file__).with_name("static")
    html = (static / "dashboard.html").read_text()
    for tag in re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S):
        assert tag == ""
    assert all("src=" in tag for tag in re.findall(r"<script\b[^>]*>", html))
    assert "<style" not in html and not re.search(r"<[^>]*\s(style|on\w+)=", html)
    for name in ("dashboard.js", "format.js"):
        script = (static / name).read_text()
        for risky in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert risky not in script, f"{name} uses {risky}"
        assert "http://" not in script and "https://" not in script  # nothing from elsewhere


async def test_a_file_is_revalidated_by_its_etag_and_an_unknown_one_is_a_404(
    make_client: Callable[..., Any], seeded: Path
) -> None:
    async with make_client(config.load(str(seeded))) as client:
        first = await get(client, "/dashboard/format.js")
        again = await get(
            client, "/dashboard/format.js", headers={"if-none-match": first.headers["etag"]}
        )
        unknown = await get(client, "/dashboard/secrets.txt")
        page_as_file = await get(client, "/dashboard/dashboard.html")
    assert first.headers["cache-control"] == "no-cache"
    assert again.status_code == 304 and again.content == b""
    for missing in (unknown, page_as_file):
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
