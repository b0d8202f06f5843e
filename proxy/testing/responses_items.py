"""What the stand-in's Responses route reads from input items: sealed content, token
counts, prompt-cache units, the tools offered.

Sealed content: the `encrypted_content` the stand-in writes on its reasoning and
compaction items is `sti1.<base64url JSON>.<hmac>`: readable, but any change breaks the
HMAC, so a proxy that edits such an item gets the error the real API gives for encrypted
content it cannot verify. Content the stand-in did not write (recorded fixtures) is opaque:
accepted unless the options say otherwise, and counted by its length.

Counts are the project counter's (estimates of OpenAI's tokenizer, as for the other routes):
a message costs its text parts, a call its name and arguments, an output its text; a
reasoning item the reasoning it seals; a compaction item the summary it seals, that is the
compacted history the model sees in place of what was dropped.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from typing import Any

import orjson

from proxy.core.tokens import TokenCounter
from proxy.testing.cache import Unit, prefix_units
from proxy.wire.responses_units import input_items, part_texts

SEAL_PREFIX = "sti1."
ITEM_OVERHEAD = 4
CALL_FRAMING = 6
OPAQUE_CHARS_PER_TOKEN = 4
SEALED = re.compile(r"^sti1\.([A-Za-z0-9_-]+={0,2})\.([0-9a-f]{32})$")


def seal(payload: dict[str, Any], key: bytes) -> str:
    data = base64.urlsafe_b64encode(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).decode()
    mac = hmac.new(key, data.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{SEAL_PREFIX}{data}.{mac}"


class SealError(ValueError):
    """Sealed content that does not verify."""


def unseal(content: str, key: bytes) -> dict[str, Any] | None:
    """The payload the stand-in sealed; None for content it did not write; SealError
    for content that claims to be the stand-in's but was changed."""
    if not content.startswith(SEAL_PREFIX):
        return None
    match = SEALED.match(content)
    if match is None:
        raise SealError(content[:24])
    data, mac = match.groups()
    want = hmac.new(key, data.encode(), hashlib.sha256).hexdigest()[:32]
    if not hmac.compare_digest(mac, want):
        raise SealError(content[:24])
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(data))
    except (ValueError, orjson.JSONDecodeError):
        raise SealError(content[:24]) from None
    if not isinstance(payload, dict):
        raise SealError(content[:24])
    return payload


def check_seals(body: dict[str, Any], key: bytes, accept_foreign: bool) -> str | None:
    """The id of the first reasoning/compaction item whose encrypted_content the stand-in
    cannot accept, else None."""
    for i, item in enumerate(input_items(body)):
        if not isinstance(item, dict) or item.get("type") not in ("reasoning", "compaction"):
            continue
        content = item.get("encrypted_content")
        if not isinstance(content, str):
            continue
        try:
            mine = unseal(content, key)
        except SealError:
            return str(item.get("id") or f"input[{i}]")
        if mine is None and not accept_foreign:
            return str(item.get("id") or f"input[{i}]")
    return None


def sealed_text(item: dict[str, Any], key: bytes) -> str | None:
    """The text a stand-in reasoning or compaction item stands for."""
    content = item.get("encrypted_content")
    if not isinstance(content, str):
        return None
    try:
        payload = unseal(content, key)
    except SealError:
        return None
    text = payload.get("text") if payload else None
    return text if isinstance(text, str) else None


class ItemCounter:
    """Token counts of Responses items and requests, on the project's counter."""

    def __init__(self, base: TokenCounter, key: bytes) -> None:
        self.base = base
        self.key = key

    def _opaque(self, text: str) -> int:
        return -(-len(text) // OPAQUE_CHARS_PER_TOKEN)

    def count_item(self, item: Any) -> int:
        if not isinstance(item, dict):
            return ITEM_OVERHEAD + self.base.count_json(item)
        kind = item.get("type", "message")
        text = self.base.count_text
        if kind == "message":
            return ITEM_OVERHEAD + sum(text(t) for t in part_texts(item.get("content")))
        if kind in ("function_call", "custom_tool_call"):
            payload = item.get("arguments", item.get("input"))
            name = item.get("name")
            return (
                ITEM_OVERHEAD
                + CALL_FRAMING
                + (text(name) if isinstance(name, str) else 0)
                + (text(payload) if isinstance(payload, str) else self.base.count_json(payload))
            )
        if kind in ("function_call_output", "custom_tool_call_output"):
            output = sum(text(t) for t in part_texts(item.get("output")))
            return ITEM_OVERHEAD + CALL_FRAMING + output
        if kind in ("reasoning", "compaction"):
            sealed = sealed_text(item, self.key)
            summary = sum(text(t) for t in part_texts(item.get("summary")))
            if sealed is not None:
                return ITEM_OVERHEAD + summary + text(sealed)
            content = item.get("encrypted_content")
            opaque = self._opaque(content) if isinstance(content, str) else 0
            return ITEM_OVERHEAD + summary + opaque
        if kind == "compaction_trigger":
            return 0
        return ITEM_OVERHEAD + self.base.count_json(item)

    def count_tools(self, tools: Any) -> int:
        if not isinstance(tools, list) or not tools:
            return 0
        return sum(ITEM_OVERHEAD + self.base.count_json(tool) for tool in tools)

    def count_request(self, body: dict[str, Any]) -> int:
        instructions = body.get("instructions")
        return (
            self.count_tools(body.get("tools"))
            + (self.base.count_text(instructions) if isinstance(instructions, str) else 0)
            + sum(self.count_item(item) for item in input_items(body))
        )

    def prompt_units(self, body: dict[str, Any]) -> list[Unit]:
        """Tools, instructions, then each item, as cache units: OpenAI caches prefixes by
        itself, so the whole prompt is one run with a breakpoint at its end."""
        pieces: list[tuple[bytes, Any, int]] = []
        running = self.count_tools(body.get("tools"))
        if running:
            pieces.append((b"tools", body.get("tools"), running))
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            running += self.base.count_text(instructions)
            pieces.append((b"instructions", instructions, running))
        for i, item in enumerate(input_items(body)):
            running += self.count_item(item)
            pieces.append((f"item\0{i}".encode(), item, running))
        model = b"responses-model\0" + str(body.get("model")).encode()
        return prefix_units(model, pieces, every_boundary=False)


def offered_custom(body: dict[str, Any], name: str) -> bool:
    return any(
        isinstance(t, dict) and t.get("type") == "custom" and t.get("name") == name
        for t in body.get("tools") or ()
    )
