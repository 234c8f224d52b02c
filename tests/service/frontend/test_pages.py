"""Pages as a person sees them: headless Chromium with every outside host unreachable loads /docs, /redoc
and the playground from a real server, and we assert what rendered. Without Chromium these tests skip, unless
BERT_REQUIRE_BROWSER=1 (as `make test` sets where it can install Chromium, e.g. CI running as root with apt-get)
makes its absence a failure."""

from __future__ import annotations

import os

import pytest

from devkit.browser import offline_page, unavailable_reason
from devkit.server import start_service

MISSING = unavailable_reason()
if MISSING is not None:
    if os.environ.get("BERT_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"BERT_REQUIRE_BROWSER=1 but the page tests cannot run: {MISSING}")
    pytest.skip(MISSING, allow_module_level=True)


@pytest.fixture(scope="module")
def url(tiny_checkpoint):
    process, url = start_service(tiny_checkpoint, "--api-key", "pages-key-123")
    yield url
    process.kill()
    process.wait()


def test_docs_render_offline_with_every_operation(url):
    with offline_page() as page:
        page.goto(url + "/docs")
        page.wait_for_selector(".opblock-summary-path", timeout=30_000)
        paths = set(page.locator(".opblock-summary-path").all_inner_texts())
        assert {"/encode", "/fill-mask", "/nsp", "/v1/embeddings", "/embed", "/embed_all", "/tokenize"} <= paths
        page.goto(url + "/redoc")
        page.wait_for_selector("h1", timeout=30_000)
        assert "BERT service" in page.locator("h1").first.inner_text()
        # The one thing ReDoc's bundle reaches for is its vendor's logo in the sidebar footer; offline it
        # is simply not shown. Nothing else (scripts, styles, fonts) leaves the machine.
        assert [u for u in page.outside_requests if u != "https://cdn.redoc.ly/redoc/logo-mini.svg"] == []


def test_playground_shows_bars_heatmap_and_the_apis_errors(url):
    with offline_page() as page:
        page.goto(url + "/")
        # Without the key the API refuses, and the page says so in the API's words.
        page.click("#fill-form button")
        page.wait_for_selector("#fill-mask .error:not([hidden])", timeout=30_000)
        assert "401: missing or wrong API key" in page.locator("#fill-mask .error").inner_text()

        page.fill("#api-key", "pages-key-123")
        page.dispatch_event("#api-key", "change")
        page.fill("#fill-text", "the cat sat on the [MASK] .")
        page.fill("#fill-k", "4")
        page.click("#fill-form button")
        page.wait_for_selector("#fill-results .bar-row", timeout=30_000)
        assert page.locator("#fill-results .bar-row").count() == 4
        scores = [float(s.rstrip("%")) for s in page.locator("#fill-results .bar-value").all_inner_texts()]
        assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 100
        widths = page.eval_on_selector_all("#fill-results .bar", "bars => bars.map(b => b.getBoundingClientRect().width)")
        assert widths == sorted(widths, reverse=True) and widths[0] > 0
        assert page.locator("#fill-mask .error").is_hidden()

        page.click("#nsp-form button")
        page.wait_for_selector("#nsp-results .bar-row", timeout=30_000)
        follows, random = (float(s.rstrip("%")) for s in page.locator("#nsp-results .bar-value").all_inner_texts())
        assert abs(follows + random - 100) < 0.2

        page.click("#sim-form button")
        page.wait_for_selector("table.heatmap td", timeout=30_000)
        cells = page.locator("table.heatmap td").all_inner_texts()
        assert len(cells) == 16 and [cells[i * 5] for i in range(4)] == ["1.00"] * 4  # the diagonal

        page.fill("#fill-text", "no mask in this one")
        page.click("#fill-form button")
        page.wait_for_selector("#fill-mask .error:not([hidden])", timeout=30_000)
        assert page.locator("#fill-mask .error").inner_text() == "422: inputs[0] has no [MASK] token (validation)"
        assert page.outside_requests == []


@pytest.fixture(scope="module")
def cross_encoder_url(tiny_cross_encoder):
    process, url = start_service(tiny_cross_encoder)
    yield url
    process.kill()
    process.wait()


def test_playground_ranks_passages_for_a_cross_encoder(cross_encoder_url):
    with offline_page() as page:
        page.goto(cross_encoder_url + "/")
        page.wait_for_selector("#rank:not([hidden])", timeout=30_000)
        # what the checkpoint cannot do is not offered
        assert page.locator("#fill-mask").is_hidden() and page.locator("#nsp").is_hidden()
        assert page.locator("#classify").is_hidden()
        page.click("#rank-form button")
        page.wait_for_selector("#rank-results .bar-row", timeout=30_000)
        labels = page.locator("#rank-results .bar-label").all_inner_texts()
        scores = [float(s) for s in page.locator("#rank-results .bar-value").all_inner_texts()]
        assert len(labels) == 4 and scores == sorted(scores, reverse=True)
        assert sorted(label.split(". ", 1)[0] for label in labels) == ["1", "2", "3", "4"]
        assert page.outside_requests == []


def test_playground_classifies_for_a_classifier(tiny_classifier):
    process, url = start_service(tiny_classifier)
    try:
        with offline_page() as page:
            page.goto(url + "/")
            page.wait_for_selector("#classify:not([hidden])", timeout=30_000)
            assert page.locator("#rank").is_hidden() and page.locator("#fill-mask").is_hidden()
            page.click("#classify-form button")
            page.wait_for_selector("#classify-results .bar-row", timeout=30_000)
            labels = page.locator("#classify-results .bar-label").all_inner_texts()
            shares = [float(s.rstrip("%")) for s in page.locator("#classify-results .bar-value").all_inner_texts()]
            assert sorted(labels) == ["negative", "neutral", "positive"]
            assert shares == sorted(shares, reverse=True) and abs(sum(shares) - 100) < 0.3  # softmax over labels
            assert page.outside_requests == []
    finally:
        process.kill()
        process.wait()


def test_playground_picks_a_model_of_several(tiny_checkpoint, tiny_cross_encoder):
    """With several models served, a picker lists them; the forms then ask the model picked, and show what it
    can do. With one model, no picker."""
    process, url = start_service(f"fill={tiny_checkpoint}", "--checkpoint", f"rank={tiny_cross_encoder}")
    try:
        with offline_page() as page:
            page.goto(url + "/")
            page.wait_for_selector("#model-choice:not([hidden])", timeout=30_000)
            options = page.locator("#model-picker option").all_inner_texts()
            assert options == ["fill (default)", "rank"]
            assert page.locator("#fill-mask").is_visible() and page.locator("#rank").is_hidden()
            page.select_option("#model-picker", "rank")
            page.wait_for_selector("#rank:not([hidden])", timeout=30_000)
            assert page.locator("#fill-mask").is_hidden() and page.locator("#model-name").inner_text() == "rank"
            page.click("#rank-form button")
            page.wait_for_selector("#rank-results .bar-row", timeout=30_000)
            assert len(page.locator("#rank-results .bar-row").all()) == 4
            page.select_option("#model-picker", "fill")
            page.wait_for_selector("#fill-mask:not([hidden])", timeout=30_000)
            page.click("#fill-form button")
            page.wait_for_selector("#fill-results .bar-row", timeout=30_000)
            assert page.outside_requests == []
    finally:
        process.kill()
        process.wait()
