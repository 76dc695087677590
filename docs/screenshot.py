"""The dashboard's screenshot (``docs/dashboard.png``) and its page weight, from one command.

    .venv/bin/python docs/screenshot.py [--out docs/dashboard.png] [--month 2026-10]

Seeds a ledger with three months of made-up traffic (``tests/dashboard_support.py``), starts a
real ``frugal serve`` on it (keyless, on loopback, with the tests' fake API as the fallback),
opens ``/dashboard`` in Debian's Chromium at 1440 px wide, and saves the whole page as a PNG
(in 128 colours). It prints what the first load fetched, response by response, headers
included: the figure ``docs/architecture.md`` gives. Needs the test extra and ``chromium``
(``./dev test`` installs both).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from PIL import Image  # noqa: E402 - matplotlib's dependency, in the test extra

from tests.dashboard_support import GOOD_MONTH, chromium, open_dashboard, seed  # noqa: E402
from tests.fake_api import FakeAPI  # noqa: E402
from tests.server.test_serve import start_server, stop_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    parser.add_argument("--month", default=GOOD_MONTH)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeAPI() as api:
        seed(Path(tmp) / "ledger.db")
        served = start_server(Path(tmp), api, server_toml='api_keys_env = ""')
        try:
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                load = open_dashboard(page, served.base + "/dashboard", month=args.month)
                if load.console_errors or load.page_errors:
                    raise SystemExit(f"the page logged errors: {load}")
                page.wait_for_selector("#live dd")  # the live state's first poll is in
                first_load = list(load.fetched)
                page.wait_for_timeout(6000)  # and its second: tokens/s is a rate between two
                page.screenshot(path=str(args.out), full_page=True)
        finally:
            stop_server(served)
    # 128 colours, no dithering: a third of the bytes, and the text stays sharp.
    shot = Image.open(args.out).convert("RGB")
    shot.quantize(colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        args.out, optimize=True
    )
    base = len(served.base)
    for url, size in first_load:
        print(f"{size:>9,} B  {url[base:]}")
    total = sum(size for _, size in first_load)
    print(f"{total:>9,} B  in all ({total / 1024:.1f} KiB), first load")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
