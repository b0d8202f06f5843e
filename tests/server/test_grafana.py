"""deploy/grafana/compaction-proxy.json queries only metrics (and labels) that a real
proxy's /metrics serves after real traffic."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from tests.server.conftest import AdminAPI, MakeProxy
from tests.server.test_admin_api import REQUEST, new_key
from tests.server.test_metrics import MakeStandIn

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "compaction-proxy.json"
METRIC = re.compile(r"\b(compaction_proxy_[a-z_]+)\b")
GROUPED = re.compile(r"\bby \(([^)]*)\)")
MATCHERS = re.compile(r"(compaction_proxy_[a-z_]+)\{([^}]*)\}")


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return found


async def test_every_queried_metric_and_label_is_served(
    make_standin: MakeStandIn, make_admin_proxy: MakeProxy, admin_key: str
) -> None:
    dashboard = orjson.loads(DASHBOARD.read_bytes())
    exprs = queries(dashboard)
    assert len(exprs) >= 20 and dashboard["uid"] == "compaction-proxy"

    # Traffic that makes every family have samples: compaction, summaries, read rounds,
    # a budget refusal.
    standin = await make_standin(StandInOptions(windows={"*": 30_000}, max_recorded=None))
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    key = await new_key(api, team="grafana")
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key["key"]) as c:
        await run_agent(
            c, turns=24, result_chars=8_000, read_every=5, conversation=uuid.uuid4().hex
        )
        await api.ok("PUT", "/admin/budgets/team/grafana", {"limits": {"day": {"output": 1}}})
        with pytest.raises(anthropic.RateLimitError):
            await c.with_options(max_retries=0).messages.create(**REQUEST)
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as r:
        text = await r.text()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)

    for expr in exprs:
        names = METRIC.findall(expr)
        assert names, expr
        for name in names:
            assert name in labels, f"{name} (in {expr!r}) is not in /metrics"
        for grouped in GROUPED.findall(expr):
            for label in filter(None, (part.strip() for part in grouped.split(","))):
                assert all(label in labels[n] for n in names), (label, expr)
        for name, matchers in MATCHERS.findall(expr):
            for label in re.findall(r"(\w+)\s*=~?", matchers):
                assert label in labels[name], (label, expr)
