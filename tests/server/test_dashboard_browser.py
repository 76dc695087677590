"""``/dashboard`` in a real browser: Debian's Chromium, headless, driven by Playwright, against two
real ``frugal serve`` processes on one seeded ledger each (``tests/dashboard_support.py``): one
with an admin key, one keyless on loopback.

What the page shows is compared with what ``frugal report --format json`` prints for the same
config, as exact decimal text.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page

from tests.dashboard_support import (
    EMPTY_MONTH,
    GOOD_MONTH,
    LOSING_MONTH,
    XSS_MODEL,
    chromium,
    open_dashboard,
    seed,
    watch,
)
from tests.fake_api import FakeAPI
from tests.faults_support import launch, stop, wait_ready
from tests.server.test_serve import FRUGAL, Served

pytestmark = [pytest.mark.serve, pytest.mark.browser]

KEYS_ENV = "FRUGAL_TEST_DASHBOARD_KEYS"
OWNER = "sk-dashboard-owner-0123456789abcdef"
MONEY = ("net_saved_usd", "api_cost_usd", "counterfactual_cost_usd", "saved_usd", "fixed_cost_usd")
ON_PAGE = {
    "net_saved_usd": "#net",
    "api_cost_usd": "#paid",
    "counterfactual_cost_usd": "#counterfactual",
    "saved_usd": "#saved",
    "fixed_cost_usd": "#fixed",
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """Two servers started side by side, each on its own copy of the seeded ledger."""
    with FakeAPI() as api:
        started: dict[str, Served] = {}
        try:
            for name, server, env in (
                ("keyed", {"api_keys_env": KEYS_ENV}, {KEYS_ENV: f"owner;admin:{OWNER}"}),
                ("keyless", {}, {}),
            ):
                tmp = tmp_path_factory.mktemp(name)
                seed(tmp / "ledger.db")
                config = {"server": server, "costs": {"monthly_fixed_usd": 40}}
                started[name] = launch(tmp, api, config=config, env=env)
            started["keyed"].key = OWNER
            for served in started.values():
                wait_ready(served)
            yield started
        finally:
            for served in started.values():
                stop(served)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    made = browser.new_context(locale="en-US", timezone_id="UTC", accept_downloads=True)
    yield made
    made.close()


def report(served: Served, month: str, *by: str) -> dict[str, Any]:
    """``frugal report --format json`` for the server's config; numbers with a fraction kept as
    their exact text."""
    done = subprocess.run(
        [FRUGAL, "report", "--config", str(served.config), "--month", month, "--format", "json"]
        + (["--by", by[0]] if by else []),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 4), done.stderr
    return dict(json.loads(done.stdout, parse_float=str))


def shown_money(page: Page) -> dict[str, str]:
    return {field: page.get_attribute(sel, "data-usd") or "" for field, sel in ON_PAGE.items()}


def dashboard(page: Page, served: Served, month: str) -> Any:
    load = open_dashboard(page, served.base + "/dashboard", month=month)
    page.wait_for_selector(f"#board[data-month='{month}']")
    return load


# -- loading ---------------------------------------------------------------------------------


def test_keyless_loopback_opens_directly_with_no_console_error_under_300_kb(
    servers: dict[str, Served], context: BrowserContext
) -> None:
    page = context.new_page()
    load = dashboard(page, servers["keyless"], GOOD_MONTH)
    page.wait_for_selector("#live dd")  # the first poll of /healthz and /metrics is in
    assert page.is_hidden("#login") and page.is_hidden("#sign-out")
    assert load.console_errors == [] and load.page_errors == []
    fetched = {url.rpartition("/")[2].partition("?")[0] for url, _ in load.fetched}
    assert {"dashboard", "dashboard.js", "uPlot.iife.min.js", "report", "healthz"} <= fetched
    assert all(url.startswith(servers["keyless"].base) for url, _ in load.fetched)  # nothing else
    assert load.total_bytes < 300 * 1024, load.fetched
    live = page.inner_text("#live")
    assert "Local engine\nup" in live and "Ledger backlog" in live


def test_the_money_shown_is_the_reports_to_the_micro_dollar(
    servers: dict[str, Served], context: BrowserContext
) -> None:
    served = servers["keyless"]
    expected = report(served, GOOD_MONTH)
    page = context.new_page()
    dashboard(page, served, GOOD_MONTH)
    assert shown_money(page) == {field: expected[field] for field in MONEY}
    assert expected["net_saved_usd"] == "32.608657"
    assert page.text_content("#net") == "$32.608657"
    assert page.is_hidden("#loss")
    assert "negative" not in (page.get_attribute("#net", "class") or "")
    # The totals row of the table by model is the report's too.
    total = page.locator("#models-table tfoot td")
    assert total.nth(3).text_content() == "$" + expected["api_cost_usd"]
    assert total.nth(1).text_content() == f"{expected['requests']:,}"


def test_money_is_written_in_the_readers_locale_without_float_rounding(
    servers: dict[str, Served], browser: Browser
) -> None:
    german = browser.new_context(locale="de-DE", timezone_id="UTC")
    try:
        page = german.new_page()
        dashboard(page, servers["keyless"], GOOD_MONTH)
        assert page.text_content("#net") == "32,608657\u00a0$"
        big = "123456789012.345678"  # more digits than a float holds
        exact = page.evaluate(
            "text => [FrugalFormat.parseReport(text).saved_usd,"
            " FrugalFormat.money('123456789012.345678'), FrugalFormat.money('-0.000001')]",
            f'{{"saved_usd": {big}, "local_share": 0.5}}',
        )
        assert exact == [big, "123.456.789.012,345678\u00a0$", "-0,000001\u00a0$"]
    finally:
        german.close()


# -- the month -------------------------------------------------------------------------------


def test_the_month_picker_changes_the_figures(
    servers: dict[str, Served], context: BrowserContext
) -> None:
    served = servers["keyless"]
    page = context.new_page()
    dashboard(page, served, GOOD_MONTH)
    good = shown_money(page)
    page.select_option("#month", LOSING_MONTH)
    page.wait_for_selector(f"#board[data-month='{LOSING_MONTH}']")
    losing = report(served, LOSING_MONTH)
    assert shown_money(page) == {field: losing[field] for field in MONEY} != good
    assert losing["net_saved_usd"].startswith("-")
    # Below zero: the net in red, and a warning that says it.
    assert "negative" in (page.get_attribute("#net", "class") or "")
    assert page.is_visible("#loss")
    assert page.text_content("#loss") == (
        "Losing money: the server's fixed cost is more than the local answers saved. "
        f"Net -${losing['net_saved_usd'][1:]}."
    )
    assert page.url.endswith(f"#month={LOSING_MONTH}")
    # Two months on, by the arrow: an empty month is an empty month, not an error.
    page.click("#next-month")
    page.click("#next-month")
    page.wait_for_selector(f"#board[data-month='{EMPTY_MONTH}']")
    assert page.text_content("#requests") == "0"
    assert page.text_content("#warnings") == "No requests were recorded in this month."
    assert page.is_hidden("#error")


# -- keys ------------------------------------------------------------------------------------


def test_a_wrong_key_gets_the_login_prompt_again_and_a_right_one_the_data(
    servers: dict[str, Served], context: BrowserContext
) -> None:
    served = servers["keyed"]
    page = context.new_page()
    load = open_dashboard(page, served.base + "/dashboard", month=GOOD_MONTH)
    assert page.is_visible("#login") and page.is_hidden("#board")
    assert not any("/v1/frugal/report" in url for url, _ in load.fetched)

    page.fill("#key", "sk-not-a-key-of-this-proxy-0123456789")
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#login-error:has-text('not accepted')")
    assert page.is_visible("#login") and page.is_hidden("#board")
    assert page.get_attribute("#net", "data-usd") == ""
    assert page.evaluate("sessionStorage.getItem('frugal.key')") is None

    sent: list[str | None] = []
    page.on(
        "request",
        lambda r: (
            sent.append(r.headers.get("authorization"))
            if "/v1/frugal/report" in r.url or "/metrics" in r.url
            else None
        ),
    )
    page.fill("#key", OWNER)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector(f"#board[data-month='{GOOD_MONTH}']")
    page.wait_for_selector("#live dd")
    assert shown_money(page)["net_saved_usd"] == report(served, GOOD_MONTH)["net_saved_usd"]
    assert sent and all(header == f"Bearer {OWNER}" for header in sent)
    # Key names are shown; the key itself never is.
    assert "batch-jobs" in page.inner_text("#keys-table")
    assert OWNER not in page.content()

    # The key is kept for this tab: a reload opens the data, another tab asks again.
    page.reload()
    page.wait_for_selector(f"#board[data-month='{GOOD_MONTH}']")
    other = context.new_page()
    open_dashboard(other, served.base + "/dashboard")
    assert other.is_visible("#login")

    page.click("#sign-out")
    assert page.is_visible("#login") and page.is_hidden("#board")
    assert page.evaluate("sessionStorage.getItem('frugal.key')") is None


# -- names are text --------------------------------------------------------------------------


def test_a_model_named_like_markup_is_shown_as_text(
    servers: dict[str, Served], context: BrowserContext
) -> None:
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    load = watch(page)
    dashboard(page, servers["keyless"], GOOD_MONTH)
    cells = page.locator("#models-table tbody td:first-child")
    assert XSS_MODEL in cells.all_text_contents()
    assert page.locator("main img").count() == 0
    assert not any(url.endswith("/x") for url, _ in load.fetched)  # no <img src=x> was made
    assert dialogs == []


# -- tables ----------------------------------------------------------------------------------


def test_tables_sort_and_download_what_is_on_screen_as_csv(
    servers: dict[str, Served], context: BrowserContext, tmp_path: Path
) -> None:
    served = servers["keyless"]
    page = context.new_page()
    dashboard(page, served, GOOD_MONTH)
    by_model = report(served, GOOD_MONTH, "model")["groups"]
    first_column = page.locator("#models-table tbody td:first-child")
    header = page.locator("#models-table th button", has_text="Saved")
    header.click()  # most saved first
    most_first = sorted(by_model, key=lambda g: -float(g["saved_usd"]))
    assert first_column.all_text_contents() == [g["model"] for g in most_first]
    assert page.get_attribute("#models-table th:nth-child(6)", "aria-sort") == "descending"
    header.click()
    assert first_column.all_text_contents() == [g["model"] for g in reversed(most_first)]

    with page.expect_download() as download:
        page.click("#models-table .table-tools button")
    path = tmp_path / "by-model.csv"
    download.value.save_as(path)
    assert download.value.suggested_filename == f"frugal-{GOOD_MONTH}-by-model.csv"
    lines = path.read_text().splitlines()
    assert lines[0] == (
        "Model,Requests,Local share,Paid (API),Without proxy,Saved,Latency tax,Failed"
    )
    rows = [line.split(",") for line in lines[1:]]
    assert [row[0] for row in rows] == [g["model"] for g in reversed(most_first)]
    assert [row[5] for row in rows] == [g["saved_usd"] for g in reversed(most_first)]
