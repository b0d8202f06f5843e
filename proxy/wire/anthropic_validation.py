"""The Messages API's request rules, strict like the API: the stand-in upstream
(proxy/testing/standin.py) answers a 400 with them, and the proxy rewrites only a request
that keeps them (docs/compaction.md, "Invalid requests").

Every check is a pure function of the decoded body: it returns the message the real API
would put in its 400 `invalid_request_error`, or None when the request is acceptable.
Wordings are the API's where they are known (see ../shared/WIRE.md).

How the conversation is read:
- Consecutive messages of the same role are merged, as the API does, before the tool
  pairing rules are applied.
- `role: "system"` messages (mid-conversation system text) are set aside for the pairing
  rules: they neither answer a tool_use nor separate a call from its result.
- Unknown block types are accepted (the proxy must pass them through unchanged).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from proxy.core.validated import Chain, Validated

ROLES = ("user", "assistant", "system")
MAX_CACHE_BREAKPOINTS = 4
MIN_THINKING_BUDGET = 1024
# Prefix of the signatures the stand-in puts on the thinking blocks it writes: those it can
# verify, so a proxy that edits the latest assistant turn's thinking gets the API's error.
STANDIN_SIGNATURE_PREFIX = "standin1."
NON_EMPTY = (
    "all messages must have non-empty content except for the optional final assistant message"
)


def thinking_signature(thinking: str) -> str:
    digest = hashlib.sha256(b"stand-in thinking\0" + thinking.encode()).hexdigest()
    return STANDIN_SIGNATURE_PREFIX + digest[:40]


def validate_messages_request(body: Any, memo: Validated | None = None) -> str | None:
    """The whole `POST /v1/messages` body. `memo`: what the conversation line's earlier
    validations kept (proxy/core/validated.py): only the messages its histories do not
    hold are walked, with the same answer."""
    error = _body_and_model_error(body)
    if error:
        return error
    if "max_tokens" not in body:
        return "max_tokens: Field required"
    max_tokens = body["max_tokens"]
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return "max_tokens: Input should be a valid integer"
    if max_tokens < 1:
        return "max_tokens: Input should be greater than or equal to 1"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "stream: Input should be a valid boolean"
    error = _thinking_budget_error(body)
    if error:
        return error
    if memo is not None and _valid_walking(body, memo):
        return None
    return _validate_prompt(body)


def _thinking_budget_error(body: dict[str, Any]) -> str | None:
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return "thinking.enabled.budget_tokens: Field required"
    if budget < MIN_THINKING_BUDGET:
        return (
            "thinking.enabled.budget_tokens: Input should be greater than or equal to "
            f"{MIN_THINKING_BUDGET}"
        )
    if budget >= body["max_tokens"]:
        return "`max_tokens` must be greater than `thinking.budget_tokens`"
    return None


def validate_count_tokens_request(body: Any) -> str | None:
    """The `POST /v1/messages/count_tokens` body: the same prompt, no max_tokens/stream."""
    return _body_and_model_error(body) or _validate_prompt(body)


def _body_and_model_error(body: Any) -> str | None:
    """Both routes want an object naming its model."""
    if not isinstance(body, dict):
        return "Input should be a valid dictionary"
    if "model" not in body:
        return "model: Field required"
    if not isinstance(body["model"], str) or not body["model"]:
        return "model: Input should be a valid string"
    return None


def window_error(input_tokens: int, window: int) -> str | None:
    if input_tokens > window:
        return f"prompt is too long: {input_tokens} tokens > {window} maximum"
    return None


def _validate_prompt(body: dict[str, Any]) -> str | None:
    for check in (_check_tools, _check_system, _check_messages, _check_cache_control):
        error = check(body)
        if error:
            return error
    return None


def _check_tools(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "tools: Input should be a valid list"
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            return f"tools.{i}: Input should be a valid dictionary"
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            return f"tools.{i}.name: Field required"
        if name in names:
            return "tools: Tool names must be unique."
        names.add(name)
        # Custom tools (no `type`, or type "custom") need a schema; server tools do not.
        if tool.get("type", "custom") == "custom" and not isinstance(
            tool.get("input_schema"), dict
        ):
            return f"tools.{i}.custom.input_schema: Field required"
    return None


def _check_system(body: dict[str, Any]) -> str | None:
    system = body.get("system")
    if system is None:
        return None
    if isinstance(system, str):
        return None  # an empty top-level system string is accepted
    if not isinstance(system, list):
        return "system: Input should be a valid list"
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            return f"system.{i}: Input tag does not match the expected tag 'text'"
        error = _text_block_error(block, f"system.{i}")
        if error:
            return error
    return None


def _text_block_error(block: dict[str, Any], where: str) -> str | None:
    text = block.get("text")
    if not isinstance(text, str):
        return f"{where}.text: Field required"
    if not text:
        return f"{where}: text content blocks must be non-empty"
    if not text.strip():
        return f"{where}: text content blocks must contain non-whitespace text"
    return None


def _check_messages(body: dict[str, Any]) -> str | None:
    messages = body.get("messages")
    if messages is None:
        return "messages: Field required"
    if not isinstance(messages, list):
        return "messages: Input should be a valid list"
    if not messages:
        return "messages: at least one message is required"
    last = len(messages) - 1
    for i, message in enumerate(messages):
        error = _check_message(message, i, is_final=i == last)
        if error:
            return error
    error = _check_pairing(messages)
    if error:
        return error
    return _check_thinking(body, messages)


def _check_message(message: Any, i: int, *, is_final: bool) -> str | None:
    where = f"messages.{i}"
    if not isinstance(message, dict):
        return f"{where}: Input should be a valid dictionary"
    role = message.get("role")
    if role not in ROLES:
        return f"{where}.role: Input should be 'user', 'assistant' or 'system'"
    if "content" not in message:
        return f"{where}.content: Field required"
    content = message["content"]
    prefill = is_final and role == "assistant"
    if isinstance(content, str):
        if prefill:
            if content != content.rstrip():
                return "final assistant content cannot end with trailing whitespace"
        elif not content:
            return f"{where}: {NON_EMPTY}"
        elif not content.strip():
            return f"{where}: text content blocks must contain non-whitespace text"
        return None
    if not isinstance(content, list):
        return f"{where}.content: Input should be a valid list"
    if not content and not prefill:
        return f"{where}: {NON_EMPTY}"
    for j, block in enumerate(content):
        error = _check_block(block, f"{where}.content.{j}", role)
        if error:
            return error
    if prefill and content:
        tail = content[-1]
        if tail.get("type") == "text" and tail["text"] != tail["text"].rstrip():
            return "final assistant content cannot end with trailing whitespace"
    return None


def _check_block(block: Any, where: str, role: str) -> str | None:
    if not isinstance(block, dict):
        return f"{where}: Input should be a valid dictionary"
    kind = block.get("type")
    if not isinstance(kind, str):
        return f"{where}.type: Field required"
    if kind == "text":
        return _text_block_error(block, where)
    if kind == "tool_use":
        if role != "assistant":
            return f"{where}: `tool_use` blocks can only be in `assistant` messages"
        for key in ("id", "name"):
            if not isinstance(block.get(key), str) or not block[key]:
                return f"{where}.{key}: Field required"
        if not isinstance(block.get("input"), dict):
            return f"{where}.input: Input should be a valid dictionary"
    elif kind == "tool_result":
        if role != "user":
            return f"{where}: `tool_result` blocks can only be in `user` messages"
        if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
            return f"{where}.tool_use_id: Field required"
        return _tool_result_content_error(block.get("content"), where)
    elif kind == "thinking":
        if not isinstance(block.get("thinking"), str):
            return f"{where}.thinking: Field required"
        if not isinstance(block.get("signature"), str) or not block["signature"]:
            return f"{where}.signature: Field required"
    elif kind == "redacted_thinking" and (
        not isinstance(block.get("data"), str) or not block["data"]
    ):
        return f"{where}.data: Field required"
    return None


def _tool_result_content_error(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"{where}.content: Input should be a valid list"
    for k, inner in enumerate(content):
        if not isinstance(inner, dict) or not isinstance(inner.get("type"), str):
            return f"{where}.content.{k}: Input should be a valid dictionary"
        if inner["type"] == "text":
            error = _text_block_error(inner, f"{where}.content.{k}")
            if error:
                return error
    return None


@dataclass
class _Turn:
    """Consecutive same-role messages merged into one, as the API sees them."""

    role: str
    blocks: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (msg index, block)


def merged_turns(messages: list[Any]) -> list[_Turn]:
    turns: list[_Turn] = []
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "system":
            continue
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not turns or turns[-1].role != role:
            turns.append(_Turn(role))
        turns[-1].blocks.extend((i, block) for block in blocks)
    return turns


def _check_pairing(messages: list[Any]) -> str | None:
    turns = merged_turns(messages)
    seen_ids: set[str] = set()
    for t, turn in enumerate(turns):
        previous = turns[t - 1] if t > 0 else None
        if turn.role == "user":
            error = _check_results(turn, previous)
            if error:
                return error
            continue
        calls = [(i, b) for i, b in turn.blocks if b.get("type") == "tool_use"]
        for i, call in calls:
            if call["id"] in seen_ids:
                return f"messages.{i}: `tool_use` ids must be unique"
            seen_ids.add(call["id"])
        if not calls:
            continue
        following = turns[t + 1] if t + 1 < len(turns) else None
        answered = _leading_result_ids(following) if following else set()
        missing = [call["id"] for _, call in calls if call["id"] not in answered]
        if missing:
            return (
                f"messages.{calls[0][0]}: `tool_use` ids were found without `tool_result` "
                f"blocks immediately after: {', '.join(missing)}. Each `tool_use` block must "
                "have a corresponding `tool_result` block in the next message."
            )
    return None


def _leading_result_ids(turn: _Turn) -> set[str]:
    """Ids answered by the tool_result blocks at the start of a user turn."""
    ids: set[str] = set()
    if turn.role != "user":
        return ids
    for _, block in turn.blocks:
        if block.get("type") != "tool_result":
            break
        ids.add(block["tool_use_id"])
    return ids


def _check_results(turn: _Turn, previous: _Turn | None) -> str | None:
    offered: set[str] = set()
    if previous is not None and previous.role == "assistant":
        offered = {b["id"] for _, b in previous.blocks if b.get("type") == "tool_use"}
    for i, block in turn.blocks:
        if block.get("type") == "tool_result" and block["tool_use_id"] not in offered:
            return (
                f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding "
                "`tool_use` block in the previous message."
            )
    # A result placed after other content is not "immediately after" its call; the calls
    # check of the previous turn reports it, this catches results without such a call.
    return None


def _check_thinking(body: dict[str, Any], messages: list[Any]) -> str | None:
    """Thinking blocks the stand-in signed must come back unmodified in the latest turn."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return None
    turns = merged_turns(messages)
    latest = next((t for t in reversed(turns) if t.role == "assistant"), None)
    if latest is None:
        return None
    return _thinking_error(latest.blocks)


def _thinking_error(blocks: list[tuple[int, dict[str, Any]]]) -> str | None:
    for i, block in blocks:
        if block.get("type") != "thinking":
            continue
        signature = block["signature"]
        if signature.startswith(STANDIN_SIGNATURE_PREFIX) and signature != thinking_signature(
            block["thinking"]
        ):
            return (
                f"messages.{i}: `thinking` or `redacted_thinking` blocks in the latest "
                "assistant message cannot be modified. These blocks must remain as they "
                "were in the original response."
            )
    return None


def _latest_assistant_turn(messages: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    """The blocks of the latest assistant turn (`merged_turns`' last of that role), read
    from the end: its messages are the last assistant ones before a user message."""
    found: list[int] = []
    for i in range(len(messages) - 1, -1, -1):
        role = messages[i]["role"]
        if role == "assistant":
            found.append(i)
        elif role == "user" and found:
            break
    blocks: list[tuple[int, dict[str, Any]]] = []
    for i in reversed(found):
        content = messages[i]["content"]
        if isinstance(content, str):
            blocks.append((i, {"type": "text", "text": content}))
        else:
            blocks.extend((i, block) for block in content)
    return blocks


def cache_control_count(body: dict[str, Any]) -> int:
    """Blocks carrying cache_control in tools, system and messages (top level counts one)."""
    count = (1 if body.get("cache_control") else 0) + _outside_breakpoints(body)
    for message in body.get("messages") or []:
        count += _content_breakpoints(message.get("content"))
    return count


def _outside_breakpoints(body: dict[str, Any]) -> int:
    """Blocks carrying cache_control in the tools and the system prompt."""
    count = 0
    for tool in body.get("tools") or []:
        count += bool(tool.get("cache_control"))
    system = body.get("system")
    if isinstance(system, list):
        count += sum(bool(b.get("cache_control")) for b in system)
    return count


def _content_breakpoints(content: Any) -> int:
    """Blocks carrying cache_control in a message's content (a tool result's count)."""
    if not isinstance(content, list):
        return 0
    count = 0
    for block in content:
        count += bool(block.get("cache_control"))
        inner = block.get("content") if block.get("type") == "tool_result" else None
        if isinstance(inner, list):
            count += sum(isinstance(b, dict) and bool(b.get("cache_control")) for b in inner)
    return count


def _check_cache_control(body: dict[str, Any]) -> str | None:
    count = cache_control_count(body)
    if count > MAX_CACHE_BREAKPOINTS:
        return (
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
            f"provided. Found {count}."
        )
    return None


# -- validating only what is new (proxy/core/validated.py) --------------------------------


@dataclass(frozen=True, slots=True)
class _Walk:
    """What the rules need of a history's first messages, all of them kept: the state
    after them (a `Chain`'s), from which the next messages are walked."""

    ids: frozenset[str] = frozenset()  # every tool_use id so far (they must be unique)
    role: str = ""  # the turn being read (consecutive messages of a role merge); "": none
    # An assistant turn's tool_use ids: the turn being read's, or in a user turn the
    # assistant turn's before it (which its results answer)
    calls: tuple[str, ...] = ()
    answered: frozenset[str] = frozenset()  # a user turn's leading tool_result ids
    leading: bool = False  # every block of the user turn so far is a tool_result
    breakpoints: int = 0  # blocks carrying cache_control so far


def _valid_walking(body: dict[str, Any], memo: Validated) -> bool:
    """Whether the prompt keeps every rule `_validate_prompt` checks (its answer is None),
    walking only the messages after those a kept history of the line repeats (the same
    objects) from the state it kept after them; the history found valid is kept. False
    also where this cannot say: the full validation then answers."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    parts = (body.get("tools"), body.get("system"))
    outside = memo.outside_value(parts)
    if outside is None:
        if _check_tools(body) or _check_system(body):
            return False
        outside = _outside_breakpoints(body)
    assert isinstance(outside, int)
    shared, chain = memo.resume(messages)
    states: list[object] = list(chain.states[:shared]) if chain is not None else []
    walk = states[-1] if states else _Walk()
    assert isinstance(walk, _Walk)
    last = len(messages) - 1
    for i in range(shared, last + 1):
        message = messages[i]
        if _check_message(message, i, is_final=i == last) is not None:
            return False
        stepped = _stepped(walk, message)
        if stepped is None:
            return False
        walk = stepped
        if i < last:
            states.append(walk)
    if not _answered(walk) or _thinking_changed(body, messages):
        return False
    top = 1 if body.get("cache_control") else 0
    if top + outside + walk.breakpoints > MAX_CACHE_BREAKPOINTS:
        return False
    memo.keep(Chain(list(messages), states, parts, outside), chain, shared)
    return True


def _thinking_changed(body: dict[str, Any], messages: list[Any]) -> bool:
    """`_check_thinking`'s rule, its latest assistant turn read from the history's end."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return False
    return _thinking_error(_latest_assistant_turn(messages)) is not None


def _stepped(walk: _Walk, message: dict[str, Any]) -> _Walk | None:
    """The state after one more message (it keeps `_check_message`'s rules), or None when
    it breaks a pairing rule: a tool_use id seen before, or a tool_result answering no
    call of the assistant turn before its own, or an assistant turn whose calls the user
    turn after it did not all answer with its leading results."""
    role, content = message["role"], message["content"]
    breakpoints = walk.breakpoints + _content_breakpoints(content)
    if role == "system":  # set aside by the pairing rules
        return walk if breakpoints == walk.breakpoints else _replace_breakpoints(walk, breakpoints)
    blocks = content if isinstance(content, list) else [{"type": "text"}]
    ids, calls, answered, leading = walk.ids, walk.calls, walk.answered, walk.leading
    if role != walk.role:  # a new turn
        if role == "assistant":
            if not _answered(walk):
                return None
            calls = ()
        else:
            answered, leading = frozenset(), True
    if role == "assistant":
        new = [block["id"] for block in blocks if block.get("type") == "tool_use"]
        if new:
            if len(set(new)) != len(new) or not ids.isdisjoint(new):
                return None
            ids, calls = ids.union(new), (*calls, *new)
    else:
        for block in blocks:
            if block.get("type") != "tool_result":
                leading = False
                continue
            answers = block["tool_use_id"]
            if answers not in calls:
                return None
            if leading:
                answered = answered.union((answers,))
    return _Walk(ids, role, calls, answered, leading, breakpoints)


def _replace_breakpoints(walk: _Walk, breakpoints: int) -> _Walk:
    return _Walk(walk.ids, walk.role, walk.calls, walk.answered, walk.leading, breakpoints)


def _answered(walk: _Walk) -> bool:
    """Whether the assistant turn last read had all its calls answered by the user turn
    after it (there is one: an assistant turn read last has none)."""
    if walk.role == "assistant":
        return not walk.calls
    return walk.answered.issuperset(walk.calls)
