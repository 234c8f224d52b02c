"""Screenshots of the playground (after a fill-mask request) and of /docs, rendered offline, for docs/api.md:

    .venv/bin/python -m devkit.screenshots            # writes docs/playground.png and docs/api-docs.png
"""

from __future__ import annotations

import sys

from devkit.browser import offline_page, unavailable_reason
from devkit.paths import REPO_ROOT
from devkit.server import start_service
from service.settings import DEFAULT_CHECKPOINT


def main() -> int:
    if unavailable_reason():
        print(unavailable_reason(), file=sys.stderr)
        return 1
    process, url = start_service(DEFAULT_CHECKPOINT)
    try:
        with offline_page(width=900, height=1000) as page:
            page.goto(url + "/")
            for form, result in (("#fill-form", "#fill-results .bar-row"), ("#nsp-form", "#nsp-results .bar-row"),
                                 ("#sim-form", "table.heatmap td")):
                page.click(f"{form} button")
                page.wait_for_selector(result, timeout=30_000)
            page.screenshot(path=str(REPO_ROOT / "docs" / "playground.png"), full_page=True)
            page.set_viewport_size({"width": 1100, "height": 800})
            page.goto(url + "/docs")
            page.wait_for_selector(".opblock-summary-path", timeout=30_000)
            page.screenshot(path=str(REPO_ROOT / "docs" / "api-docs.png"))
            assert not page.outside_requests, page.outside_requests
    finally:
        process.kill()
        process.wait()
    print("wrote docs/playground.png and docs/api-docs.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
