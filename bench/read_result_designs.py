"""What the read_result tool's arrival costs: designs of when it joins the tools, priced.

Tools come first in the Messages API's cache prefix, so the request that first carries
the injected `read_result` tool reads nothing of its prompt from the cache: system,
tools and history are all written again. Shipped, the tool joins at the first offload.
Each design here is replayed (`compaction-proxy replay`'s simulation: the planner and
the stand-in's prompt-cache model) on recorded Claude Code sessions (bench/sessions/):

- `at the first offload`: as shipped;
- `from the first request`: every request that has tools carries the tool (it is read
  from the cache with the rest; the model sees it from the start);
- `from N tokens of history`: it joins once the history (messages, exact count) reaches
  N, before the offload trigger, so the rewrite it causes is smaller.

The earlier designs are simulated by giving the session's bodies the proxy's own tool
definition (the same bytes it injects) from that request on, and having the simulated
proxy treat that definition as its own (not the client's tool of the same name), so it
neither renames nor adds it again. Each ratio is against the same session unmanaged.

`--tool-search` gives sessions recorded without tool search a synthetic approximation of
it: their rarely used tools (DEFERRED) marked `defer_loading` and a ToolSearch tool
listed, both ways, so the shipped design defers read_result too (proxy/wire/anthropic.py
`with_read_result`). What Claude Code really sends with `ENABLE_TOOL_SEARCH=true` differs
(those tools not sent at all, the beta `advanced-tool-use-2025-11-20` on every request):
the sessions recorded so (bench/sessions/*-tool-search.zst, `bench/record_session.py
--tool-search`) need no option; each session is replayed under its recorded betas.

    .venv/bin/python bench/read_result_designs.py [--at 5000,10000] [--policy k=v,..]
        [--tool-search] SESSION..
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from session_file import read_session  # noqa: E402

from proxy.core.policy import DEFAULT_POLICIES, policy_for  # noqa: E402
from proxy.core.tokens import default_counter  # noqa: E402
from proxy.ops.replay import replay  # noqa: E402
from proxy.wire.anthropic import MessagesRequest, read_result_tool  # noqa: E402

MODEL = "claude-opus-5-5"
NAME = "read_result"
OURS = read_result_tool(NAME)


@contextmanager
def tool_known() -> Iterator[None]:
    """The simulated proxy takes a body's `read_result` tool with its own definition for
    the one it injects: it offloads under that name and does not add it again."""
    tool_name, with_history = MessagesRequest.tool_name, MessagesRequest.with_history

    def name(self: MessagesRequest, body: Mapping[str, Any]) -> str | None:
        tools = body.get("tools")
        if isinstance(tools, list) and OURS in tools:
            return NAME
        return tool_name(self, body)

    def history(
        self: MessagesRequest,
        body: Mapping[str, Any],
        messages: list[Any],
        tool: str | None,
        tool_search: bool = False,
    ) -> Any:
        tools = body.get("tools")
        if tool == NAME and isinstance(tools, list) and OURS in tools:
            return {"messages": messages}
        return with_history(self, body, messages, tool, tool_search)

    MessagesRequest.tool_name = name  # type: ignore[method-assign]
    MessagesRequest.with_history = history  # type: ignore[method-assign]
    try:
        yield
    finally:
        MessagesRequest.tool_name = tool_name  # type: ignore[method-assign]
        MessagesRequest.with_history = with_history  # type: ignore[method-assign]


# What Claude Code 2.1.x defers with tool search on, of the tools these sessions list.
DEFERRED = frozenset({
    "CronCreate", "CronDelete", "CronList", "EnterWorktree", "ExitWorktree", "NotebookEdit",
    "SendMessage", "TaskCreate", "TaskGet", "TaskList", "TaskOutput", "TaskStop",
    "TaskUpdate", "WebFetch", "WebSearch",
})  # fmt: skip
TOOL_SEARCH = {
    "name": "ToolSearch",
    "description": "Fetches full schema definitions for deferred tools so they can be called.",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}


def with_tool_search(body: dict[str, Any]) -> dict[str, Any]:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return body
    marked = [{**t, "defer_loading": True} if t.get("name") in DEFERRED else t for t in tools]
    return {**body, "tools": [*marked, TOOL_SEARCH]}


def with_tool_from(bodies: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    out = []
    for n, body in enumerate(bodies):
        tools = body.get("tools")
        if n >= first and isinstance(tools, list) and tools:
            body = {**body, "tools": [*tools, OURS]}
        out.append(body)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sessions", nargs="+", type=Path)
    parser.add_argument("--at", default="5000,10000", help="history sizes to join at (a,b,..)")
    parser.add_argument("--window", type=int, default=1_000_000)
    parser.add_argument("--policy", default="", help="fields of the model's policy: k=v,..")
    parser.add_argument("--tool-search", action="store_true", help="bodies as with tool search on")
    args = parser.parse_args()
    policy = dataclasses.replace(policy_for(MODEL, DEFAULT_POLICIES), window=args.window)
    for item in filter(None, args.policy.split(",")):
        key, value = item.split("=", 1)
        policy = dataclasses.replace(policy, **{key: int(value)})
    policies = [dataclasses.replace(policy, match=MODEL)]
    counter = default_counter()
    print(
        f"policy: window {policy.window:,}, offload_trigger {policy.offload_tokens:,},"
        f" stub head {policy.stub_head_chars}, keep_results {policy.keep_results}"
    )
    for path in args.sessions:
        main = [r for r in read_session(path) if r.kind in ("tool", "text")]
        bodies = [orjson.loads(r.body) for r in main]
        betas = next((v for k, v in main[0].headers.items() if k.lower() == "anthropic-beta"), "")
        if args.tool_search:
            bodies = [with_tool_search(b) for b in bodies]
        shipped = replay(bodies, policies, counter, betas=betas)
        plain = shipped.direct_cost
        rows = [("at the first offload", shipped.proxy_cost)]
        with tool_known():
            early = replay(with_tool_from(bodies, 0), policies, counter, betas=betas)
            rows.append(("from the first request", early.proxy_cost))
            sizes = [sum(counter.count_message(m) for m in b["messages"]) for b in bodies]
            for at in (int(a) for a in args.at.split(",") if a):
                first = next((n for n, size in enumerate(sizes) if size >= at), len(bodies))
                joined = replay(with_tool_from(bodies, first), policies, counter, betas=betas)
                label = f"from {at:,} tokens of history (request {first + 1})"
                rows.append((label, joined.proxy_cost))
        print(f"{path.name}: {len(bodies)} requests, unmanaged {plain:,.0f} units")
        for label, cost in rows:
            print(f"  {label}: {cost:,.0f} units, {cost / plain:.3f}x")


if __name__ == "__main__":
    main()
