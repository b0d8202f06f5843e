"""The dashboard in a real browser (Chromium through Playwright), as an operator uses it:
one admin key, a key and a budget made in the page, traffic from the anthropic SDK with
that key through a compacting proxy to the stand-in, the figures the page shows checked
against /admin/stats and /admin/budgets, screenshots saved, and the key revoked in the
page.

Screenshots go to the test's temporary directory, and also to $DASHBOARD_SCREENSHOTS_DIR
when set (`DASHBOARD_SCREENSHOTS_DIR=docs pytest tests/server/test_dashboard.py` renews
the README's pictures).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from playwright.async_api import Browser, Page

from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from tests.server.conftest import UPSTREAM_KEY_ENV, AdminAPI, MakeProxy
from tests.server.test_admin_api import REQUEST, stats_when
from tests.server.test_metrics import MakeStandIn

STORAGE = "compaction-proxy-admin-key"
LAPTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def shown(value: Any, kind: str) -> str:
    """What the page shows for a figure: app.js's `format`, written again."""
    if value is None:
        return "–"
    if kind == "int":
        return f"{round(value):,}"
    if kind == "share":
        return f"{value * 100:.2f}%"
    micro = round(abs(value) * 1e6)
    sign = "-" if value < 0 and micro > 0 else ""
    if micro >= 995_000 or micro == 0:
        cents = (micro + 5_000) // 10_000
        return f"{sign}{cents // 100:,}.{cents % 100:02d}"
    return f"{sign}0.{(micro + 50) // 100:04d}"


def at(root: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(root, dict):
            return None
        root = root.get(part)
    return root


@pytest.mark.parametrize(
    ("value", "kind", "text"),
    [
        (1234567, "int", "1,234,567"),
        (0.8032, "share", "80.32%"),
        (165762.6, "cost", "165,762.60"),
        (0.004512, "cost", "0.0045"),
        (0.999999, "cost", "1.00"),
        (-12.5, "cost", "-12.50"),
        (0, "cost", "0.00"),
        (None, "int", "–"),
    ],
)
def test_figure_formats(value: Any, kind: str, text: str) -> None:
    assert shown(value, kind) == text


async def figures(page: Page, attribute: str) -> list[dict[str, str]]:
    """Every marked figure on the page, read in one go (between two refreshes)."""
    found: list[dict[str, str]] = await page.eval_on_selector_all(
        f"[data-{attribute}]",
        f"nodes => nodes.map(n => ({{path: n.dataset.{attribute}, format: n.dataset.format,"
        " text: n.textContent}))",
    )
    return found


async def refreshed_after(page: Page, unix: float) -> None:
    await page.wait_for_function(
        "(unix) => Number(document.querySelector('#status').dataset.generated || 0) > unix",
        arg=unix,
        timeout=20_000,
    )


def save(page_png: bytes, tmp_path: Path, name: str, *, readme: bool = True) -> Path:
    path = tmp_path / name
    path.write_bytes(page_png)
    wanted = os.environ.get("DASHBOARD_SCREENSHOTS_DIR")
    if wanted and readme:
        (Path(wanted) / name).write_bytes(page_png)
    return path


async def check_stats_figures(page: Page, api: AdminAPI) -> list[list[str]]:
    seen = await figures(page, "stat")
    stats = await api.ok("GET", "/admin/stats")
    for figure in seen:
        path = orjson.loads(figure["path"])
        expected = shown(at(stats, path), figure["format"])
        assert figure["text"] == expected, (path, figure["text"], expected)
    return [orjson.loads(f["path"]) for f in seen]


async def test_keys_budgets_and_savings_from_the_browser(
    make_standin: MakeStandIn,
    make_admin_proxy: MakeProxy,
    admin_key: str,
    browser: Browser,
    tmp_path: Path,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 30_000}, max_recorded=None))
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    page = await browser.new_page(viewport=LAPTOP)
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)

    # The admin key once, in the fragment: kept in the tab, gone from the address.
    await page.goto(f"{proxy.url}/dashboard#admin_key={admin_key}")
    await page.wait_for_selector("#status[data-generated]")
    assert "admin_key" not in page.url and admin_key not in await page.content()
    assert await page.evaluate(f"sessionStorage.getItem('{STORAGE}')") == admin_key

    # A key and its budget, made in the page.
    await page.fill("#key-team", "infra")
    await page.fill("#key-name", "made in the browser")
    await page.fill("#key-env", UPSTREAM_KEY_ENV)
    await page.click("#key-form button[type=submit]")
    await page.wait_for_selector("#new-key:not([hidden])")
    key = (await page.text_content("#new-key-text") or "").strip()
    key_id = key.split("_")[1]
    assert key.startswith(f"cpk_{key_id}_")
    await page.click("#new-key-done")
    assert await page.text_content("#new-key-text") == ""
    await page.select_option("#budget-kind", "key")
    await page.fill("#budget-name", key_id)
    await page.select_option("#budget-period", "day")
    await page.fill("#budget-input", "5000000")
    await page.fill("#budget-output", "200000")
    await page.click("#budget-form button[type=submit]")
    await page.wait_for_selector(f"#budget-result:text('Set: key {key_id}')")
    # A team with a budget too small for any request: its refusal shows as well.
    await page.fill("#key-team", "tiny")
    await page.fill("#key-env", UPSTREAM_KEY_ENV)
    await page.click("#key-form button[type=submit]")
    await page.wait_for_selector("#new-key:not([hidden])")
    tiny_key = (await page.text_content("#new-key-text") or "").strip()
    await page.click("#new-key-done")
    await page.select_option("#budget-kind", "team")
    await page.fill("#budget-name", "tiny")
    await page.fill("#budget-input", "")
    await page.fill("#budget-output", "10")
    await page.click("#budget-form button[type=submit]")
    await page.wait_for_selector("#budget-result:text('Set: team tiny')")

    # Traffic with the keys made in the page: compaction, summaries, read rounds.
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0) as c:
        turns = await run_agent(
            c, turns=24, result_chars=8_000, read_every=5, conversation=uuid.uuid4().hex
        )
    assert any(t.headers.get("x-compaction-summary") in ("made", "ahead", "waited") for t in turns)
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key=tiny_key, max_retries=0) as c:
        with pytest.raises(anthropic.RateLimitError):
            await c.messages.create(**REQUEST)
    stats = await stats_when(api, lambda s: bool(s["last_hour"]["requests"] == len(turns) + 1))
    assert stats["last_hour"]["history_tokens"]["saved"] > 0
    await refreshed_after(page, stats["generated_at_unix"])

    # Every figure shown is what /admin/stats says, in every window.
    compared = await check_stats_figures(page, api)
    for essential in (
        ["last_hour", "requests"],
        ["last_hour", "history_tokens", "saved"],
        ["last_hour", "cost", "cache_model_units", "with_proxy"],
        ["last_hour", "cost", "cache_model_units", "without_proxy"],
        ["last_hour", "cost", "cache_model_units", "saved"],
        ["last_hour", "cache_read_share"],
        ["last_hour", "budget_refusals"],
        ["last_hour", "by_team", "infra", "requests"],
        ["last_hour", "by_model", "claude-test-1", "history_tokens_saved"],
    ):
        assert essential in compared, essential
    assert len(compared) > 40
    for window in ("since_start", "last_day"):
        await page.select_option("#window", window)
        assert [window, "requests"] in await check_stats_figures(page, api)
    await page.select_option("#window", "last_hour")
    # Budgets: what the key and the team spent against their limits.
    budgets = {(b["kind"], b["id"]): b for b in (await api.ok("GET", "/admin/budgets"))["budgets"]}
    shown_budgets = await figures(page, "budget")
    assert len(shown_budgets) == 3
    for figure in shown_budgets:
        kind, name, period, metric = orjson.loads(figure["path"])
        report = budgets[(kind, name)]
        used, limit = report["used"][period][metric], report["limits"][period][metric]
        assert figure["text"] == f"{used:,} / {limit:,}"
    assert budgets[("key", key_id)]["used"]["day"]["input"] > 0
    # The crossings and the conversation are listed.
    assert await page.locator("#crossings tbody tr").count() == stats["last_hour"]["crossings"]
    assert await page.locator("#conversations .bar-row").count() == 1

    await page.evaluate("window.scrollTo(0, 0)")
    full = save(await page.screenshot(full_page=True), tmp_path, "dashboard-full.png", readme=False)
    laptop = save(await page.screenshot(), tmp_path, "dashboard-laptop.png")
    await page.set_viewport_size(PHONE)
    await page.wait_for_timeout(300)  # the charts redraw for the new width
    assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    phone = save(await page.screenshot(), tmp_path, "dashboard-phone.png")
    assert min(p.stat().st_size for p in (full, laptop, phone)) > 10_000
    await page.set_viewport_size(LAPTOP)

    # Revoked in the page: the key stops working.
    page.once("dialog", lambda dialog: dialog.accept())
    await page.click(f"[data-revoke='{key_id}']")
    await page.wait_for_selector(f"[data-revoke='{key_id}']", state="detached")
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0) as c:
        with pytest.raises(anthropic.AuthenticationError):
            await c.messages.create(**REQUEST)
    assert problems == []


async def test_a_wrong_admin_key_is_refused_and_forgotten(
    make_standin: MakeStandIn, make_admin_proxy: MakeProxy, admin_key: str, browser: Browser
) -> None:
    standin = await make_standin(StandInOptions())
    proxy = await make_admin_proxy(standin.url)
    page = await browser.new_page(viewport=PHONE)
    await page.goto(f"{proxy.url}/dashboard")
    await page.wait_for_selector("#login:not([hidden])")
    await page.fill("#admin-key", "not-the-admin-key-at-all")
    await page.click("#login-form button[type=submit]")
    await page.wait_for_selector("#login-error:text('refused that admin key')")
    assert await page.evaluate(f"sessionStorage.getItem('{STORAGE}')") is None
    await page.fill("#admin-key", admin_key)
    await page.click("#login-form button[type=submit]")
    await page.wait_for_selector("#status[data-generated]")
    await page.click("#forget")
    assert await page.evaluate(f"sessionStorage.getItem('{STORAGE}')") is None
    assert await page.is_visible("#login")
    # The page itself holds no secret and loads nothing from elsewhere.
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/dashboard") as r:
        policy = r.headers["Content-Security-Policy"]
        body = await r.text()
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert admin_key not in body and "://" not in body
