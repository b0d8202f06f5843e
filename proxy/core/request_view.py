"""A request's view: what the core reads of it beside its messages, asked of its format in
one go.

Counting (proxy/core/counting.py) makes it once per count, with the messages' counts,
and carries it on `Counted.view`: the fixed parts' tokens (the system prompt and tools,
kept in the reuse cache while they are the same objects), the name read_result takes in
the request and what its tool adds. The driver plans with these (proxy/core/driver.py)
rather than ask the format for each again, and the format is asked in one place, its
answers together: the name and the tool, then the fixed parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.reuse import Known, Seen
from proxy.core.tokens import TOOLS_PREAMBLE, referenced_tools
from proxy.core.wire_format import MessageCounter, WireFormat

# The top-level fields each format's fixed tokens are counted from.
FIXED_FIELDS = ("system", "tools", "instructions")


@dataclass(frozen=True, slots=True)
class RequestView:
    """What the format says of a request beside its messages."""

    fixed_tokens: int  # the system prompt and tools, estimated
    tool: str | None = None  # read_result's name in this request; None: offload is off
    # What read_result adds to the request's tokens where it joins (its definition, and
    # what loads it where the format defers it); 0 when there is no name.
    tool_tokens: int = 0
    # Made for a request read_result may join deferred (`Request.with_history`): tool
    # search on for it (its betas say so), or the proxy defers it for the model
    # (CompactionRequest.defers), which the count is told by the shell.
    tool_search: bool = False


def view_of(
    wire: WireFormat,
    counter: MessageCounter,
    body: Mapping[str, Any],
    seen: Seen | None,
    facts: Sequence[Known] = (),
    tool_search: bool = False,
) -> RequestView:
    """The request's view, its system prompt's and tools' tokens kept while they are the
    same objects; with a deferred tool (tool search: it counts once a `tool_reference`
    of the messages loads it), while the messages also name the same tools (each
    message's names found once, kept with its facts: `facts`, counting's)."""
    if seen is None:
        return request_view(wire, counter, body, None, tool_search)
    parts = tuple(body.get(name) for name in FIXED_FIELDS)
    names = _loading(facts) if defers(body.get("tools")) else None
    fixed = seen.fixed_value("fixed_tokens", parts, names)
    view = request_view(wire, counter, body, None if fixed is None else int(fixed), tool_search)
    if fixed is None:
        seen.keep_fixed("fixed_tokens", parts, view.fixed_tokens, names)
    return view


def request_view(
    wire: WireFormat,
    counter: MessageCounter,
    body: Mapping[str, Any],
    fixed: int | None = None,
    tool_search: bool = False,
) -> RequestView:
    """What the format says of the request beside its messages, asked in one go:
    read_result's name and tool, then the fixed parts' tokens (unless `fixed` gives
    them) and what the tool adds. Tool counts are additive (no re-hashing the client's
    tools): the tool alone, less the tools preamble the client's list pays, and what
    loads it where it joins deferred (only ever with tool search on for the request, or
    beside deferred tools of the client's own: `Request.with_history`)."""
    tools = body.get("tools")
    name = wire.tool_name(body)
    tool = wire.read_result_tool(name) if name else None
    if fixed is None:
        fixed = wire.fixed_tokens(counter, body)
    if not name or tool is None:
        return RequestView(fixed, tool_search=tool_search)
    preamble = TOOLS_PREAMBLE if isinstance(tools, list) and tools else 0
    added = counter.count_tools([tool]) - preamble
    if tool_search or defers(tools):
        added += wire.loading_tokens(counter, name, tools, tool_search)
    return RequestView(fixed, name, added, tool_search)


def defers(tools: object) -> bool:
    """Whether the client defers any of its tools (tool search's `defer_loading`)."""
    return isinstance(tools, list) and any(
        isinstance(t, dict) and t.get("defer_loading") is True for t in tools
    )


def _loading(facts: Sequence[Known]) -> frozenset[str]:
    """The tool names the messages' `tool_reference` blocks give (tokens.referenced_tools),
    each message scanned once."""
    names: set[str] = set()
    for known in facts:
        if known.tool_refs is None:
            known.tool_refs = frozenset(referenced_tools([known.message]))
        names |= known.tool_refs
    return frozenset(names)
