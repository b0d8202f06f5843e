"""`compaction-proxy audit FILE`: where a request's context window goes.

Every token of the request is put in one part: the system prompt, the tool definitions,
each role's text (message framing included), thinking, images and documents, tool calls
and tool results per tool name. Parts are listed largest first with their share, then
the request's size against its policy's trigger and window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.policy import Policy, policy_for
from proxy.core.tokens import TokenCounter, loaded_tools


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    tokens: int
    items: int  # messages for a role's text, else blocks or definitions


def _tool_names(messages: Sequence[Any]) -> dict[str, str]:
    names = {}
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        for b in content if isinstance(content, list) else []:
            if isinstance(b, dict) and b.get("type") in ("tool_use", "server_tool_use"):
                names[str(b.get("id"))] = str(b.get("name", "?"))
    return names


def _part_of(block: Any, role: str, names: Mapping[str, str]) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in ("tool_use", "server_tool_use"):
        return f"tool calls: {block.get('name', '?')}"
    if kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_tool_result")):
        return f"tool results: {names.get(str(block.get('tool_use_id')), '?')}"
    if kind in ("thinking", "redacted_thinking"):
        return f"{role} thinking"
    if kind == "image":
        return f"{role} images"
    if kind == "document":
        return f"{role} documents"
    return f"{role} messages" if role == "system" else f"{role} text"


def audit(body: Mapping[str, Any], counter: TokenCounter) -> list[Part]:
    """The request's parts, largest first; their tokens sum to count_request(body)."""
    tokens: dict[str, int] = {}
    items: dict[str, int] = {}

    def add(name: str, count: int, n: int = 1) -> None:
        tokens[name] = tokens.get(name, 0) + count
        items[name] = items.get(name, 0) + n

    system = body.get("system")
    if system:
        add(
            "system prompt",
            counter.count_system(system),
            len(system) if isinstance(system, list) else 1,
        )
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    # Deferred tools (tool search) are in the prompt only once a tool_reference loads them.
    tools = loaded_tools(body.get("tools"), messages)
    if tools:
        add(
            "tool definitions",
            counter.count_tools(tools),
            len(tools) if isinstance(tools, list) else 1,
        )
    names = _tool_names(messages)
    for m in messages:
        if not isinstance(m, dict):
            add("other", counter.count_message(m))
            continue
        role = str(m.get("role", "other"))
        whole = counter.count_message(m)
        content = m.get("content")
        own = f"{role} messages" if role == "system" else f"{role} text"
        if not isinstance(content, list):
            add(own, whole)
            continue
        inside = 0
        for block in content:
            count = counter.count_block(block)
            inside += count
            part = _part_of(block, role, names)
            add(part, count, 0 if part == own else 1)
        add(own, whole - inside)  # the message's own framing; items count messages here
    parts = [Part(n, t, items[n]) for n, t in tokens.items() if t or items[n]]
    return sorted(parts, key=lambda p: (-p.tokens, p.name))


def history_tokens(body: Mapping[str, Any], counter: TokenCounter) -> int:
    messages = body.get("messages")
    return sum(counter.count_message(m) for m in messages) if isinstance(messages, list) else 0


def render_audit(
    body: Mapping[str, Any], counter: TokenCounter, policies: Sequence[Policy], betas: str = ""
) -> str:
    parts = audit(body, counter)
    total = sum(p.tokens for p in parts)
    width = max([len(p.name) for p in parts] + [len("part"), len("total")])
    lines = [f"{'part':<{width}}  {'items':>6}  {'tokens':>9}  {'share':>6}"]
    lines.append("-" * len(lines[0]))
    for p in parts:
        share = 100 * p.tokens / total if total else 0.0
        lines.append(f"{p.name:<{width}}  {p.items:>6}  {p.tokens:>9,}  {share:>5.1f}%")
    lines.append("-" * len(lines[0]))
    lines.append(f"{'total':<{width}}  {'':>6}  {total:>9,}  {100.0 if total else 0:>5.1f}%")
    model = str(body.get("model", ""))
    policy = policy_for(model, policies, betas=betas)
    history = history_tokens(body, counter)
    trigger = policy.trigger_tokens
    verdict = (
        f"over the trigger by {history - trigger:,}: the proxy would rewrite it"
        if history > trigger
        else f"{trigger - history:,} under the trigger: forwarded untouched"
    )
    lines += [
        "",
        f"model {model or '(none)'}: policy {policy.match!r}, window {policy.window:,}"
        f" ({policy.window_source}), trigger {trigger:,}, target {policy.target_tokens:,}"
        " (history tokens)",
        f"history {history:,} tokens, {len(body.get('messages') or [])} messages; {verdict}",
        f"whole request {total:,} tokens = {100 * total / policy.window:.1f}% of the window"
        " (estimated with the proxy's counter, before calibration)",
    ]
    return "\n".join(lines)
