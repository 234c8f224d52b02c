"""Headless Chromium (Debian's package) driven by Playwright, with every host but loopback unreachable:
what a person on an air-gapped machine sees. Used by the page tests and by the screenshot script."""

from __future__ import annotations

import shutil
from contextlib import contextmanager

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Every name but the loopback address resolves to nothing: a page that reaches for a CDN shows it.
LOCAL = ("http://127.0.0.1", "data:", "blob:http://127.0.0.1")
OFFLINE_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]


def unavailable_reason() -> str | None:
    """Why the browser cannot run here, or None."""
    if CHROMIUM is None:
        return "Chromium is not installed (apt-get install chromium; `make test` does this where it can)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (requirements/dev.txt)"
    return None


@contextmanager
def offline_page(width: int = 1000, height: int = 900):
    """A page in headless Chromium; `page.outside_requests` lists any request to a host other than 127.0.0.1."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=OFFLINE_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.outside_requests = []
            page.on("request", lambda r: None if r.url.startswith(LOCAL) else page.outside_requests.append(r.url))
            yield page
        finally:
            browser.close()
