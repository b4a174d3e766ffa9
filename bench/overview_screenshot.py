"""A screenshot of the operator's overview (the admin's landing page) of a running
Chorus: logs in through the admin's form with Debian's Chromium and saves the
whole page as a PNG. Starts nothing itself.

  .venv/bin/python bench/overview_screenshot.py http://127.0.0.1:8000 \
      --user admin [--password ... | CHORUS_ADMIN_PASSWORD=...] [--out overview.png]
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from playwright.sync_api import sync_playwright


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", help="where Chorus serves, e.g. http://127.0.0.1:8000")
    parser.add_argument("--user", required=True, help="a staff user allowed to view jobs")
    parser.add_argument("--password", default=os.environ.get("CHORUS_ADMIN_PASSWORD"))
    parser.add_argument("--out", default="overview.png")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument(
        "--chromium", default=os.environ.get("CHORUS_CHROMIUM", "/usr/bin/chromium")
    )
    args = parser.parse_args()
    password = args.password or getpass.getpass(f"password for {args.user}: ")
    base = args.url.rstrip("/")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium)
        page = browser.new_page(viewport={"width": args.width, "height": 1000})
        page.goto(f"{base}/admin/login/?next=/admin/")
        page.fill("#id_username", args.user)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_load_state("load")
        if page.locator("#overview").count() == 0:
            browser.close()
            sys.exit(f"no overview at {page.url}: wrong credentials, or the user may not view jobs")
        page.screenshot(path=args.out, full_page=True)
        browser.close()
    print(args.out)


if __name__ == "__main__":
    main()
