"""The Gemini API's contents and parts, read as the proxy needs them (pure).

A Gemini history is `contents`: `{"role": "user" | "model", "parts": [...]}` objects.
A part holds one kind of data (`text`, `inlineData`, `fileData`, `functionCall`,
`functionResponse`, `executableCode`, `codeExecutionResult`), and may be a `thought` or
carry a `thoughtSignature`. The API reads field names in camelCase or snake_case alike
(its own REST examples write `inline_data`), so every field is read under both (`field`).

Function calls and their responses are matched the way the API checks them: by count
(the user turn after a model turn with calls answers all of them, one response each), not
by id: the API sends no call ids, and clients make up their own. So a call or response
is named by its position among the turn's calls or responses (`call0`, `call1`, ...):
that is what a `Shape`'s calls and answers hold, and what a read_result call is known by.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import orjson

from proxy.core.image_size import dimensions_from_base64
from proxy.core.tokens import (
    MESSAGE_OVERHEAD,
    PDF_TOKENS_PER_PAGE,
    PDF_UNKNOWN_PAGES,
    TOOL_FRAMING,
    TokenCounter,
    pdf_tokens_from_base64,
)
from proxy.wire.common import FormatCounter

Part = Mapping[str, Any]

# The kinds of data a part holds (the API's `data` oneof).
DATA_FIELDS = (
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
    "toolCall",
    "toolResponse",
)

_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])([A-Z])")


@cache
def snake(name: str) -> str:
    """A camelCase field name as the API also accepts it (`inlineData` -> `inline_data`)."""
    return _CAMEL_HUMP.sub(r"_\1", name).lower()


def field(obj: Mapping[str, Any], name: str) -> Any:
    """A field by its camelCase name, or its snake_case spelling."""
    value = obj.get(name)
    if value is None and name != (other := snake(name)):
        value = obj.get(other)
    return value


def has_field(obj: Mapping[str, Any], name: str) -> bool:
    return name in obj or snake(name) in obj


def parts_of(content: Mapping[str, Any]) -> list[Part]:
    """A content's parts that are objects ([] when it has none)."""
    parts = content.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def role_of(content: Mapping[str, Any]) -> str:
    """The content's role; the API reads an unset role as the user's."""
    role = content.get("role")
    return role if isinstance(role, str) and role else "user"


def function_calls(content: Mapping[str, Any]) -> list[Part]:
    """The content's functionCall parts, in order (the part, not the call inside it)."""
    return [p for p in parts_of(content) if isinstance(field(p, "functionCall"), dict)]


def function_responses(content: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """(part index, functionResponse) of the content's function responses, in order."""
    out: list[tuple[int, Mapping[str, Any]]] = []
    for i, part in enumerate(parts_of(content)):
        response = field(part, "functionResponse")
        if isinstance(response, dict):
            out.append((i, response))
    return out


def call_key(position: int) -> str:
    """How the proxy names the call at this position among a turn's calls (and the
    response at the same position among the next turn's responses)."""
    return f"call{position}"


def is_thought(part: Part) -> bool:
    return part.get("thought") is True


def signature_of(part: Part) -> str | None:
    value = field(part, "thoughtSignature")
    return value if isinstance(value, str) else None


# -- function responses as text ------------------------------------------------------------


def response_text(response: Mapping[str, Any]) -> str | None:
    """A function response's text, for offload and reading back: the string of a response
    that is one string field (`{"output": "..."}`, as agents send them), else the
    response's JSON; None when it carries media parts (never cut)."""
    if isinstance(response.get("parts"), list) and response["parts"]:
        return None
    inner = response.get("response")
    if not isinstance(inner, dict):
        return None
    if len(inner) == 1:
        (value,) = inner.values()
        if isinstance(value, str):
            return value
    return orjson.dumps(inner).decode()


def with_response_text(response: Mapping[str, Any], text: str) -> dict[str, Any]:
    """A copy of a function response whose content is `text` (a stub), under the same
    field when it was one string field, else as `output` (what the API documents)."""
    inner = response.get("response")
    key = "output"
    if isinstance(inner, dict) and len(inner) == 1:
        (only,) = inner
        if isinstance(inner[only], str):
            key = only
    return {**response, "response": {key: text}}


# -- the transcript the summariser reads --------------------------------------------------


def part_line(part: Part) -> str | None:
    """One part as a transcript line (None: left out, as thoughts are)."""
    if is_thought(part):
        return None  # the model's private reasoning: not facts of the conversation
    text = field(part, "text")
    if isinstance(text, str):
        return text
    call = field(part, "functionCall")
    if isinstance(call, dict):
        arguments = orjson.dumps(call.get("args", {})).decode()
        return f"[function call {call.get('name')}] {arguments}"
    response = field(part, "functionResponse")
    if isinstance(response, dict):
        body = response_text(response)
        shown = body if body is not None else "[media]"
        return f"[function response {response.get('name')}]\n{shown}"
    for name in ("inlineData", "fileData"):
        data = field(part, name)
        if isinstance(data, dict):
            kind = field(data, "mimeType") or "data"
            uri = field(data, "fileUri")
            return f"[{kind} {uri}]" if isinstance(uri, str) else f"[{kind}]"
    code = field(part, "executableCode")
    if isinstance(code, dict):
        return f"[code {code.get('language', '')}]\n{code.get('code', '')}"
    result = field(part, "codeExecutionResult")
    if isinstance(result, dict):
        return f"[code result {result.get('outcome', '')}]\n{result.get('output', '')}"
    names = [k for k in part if k not in ("thoughtSignature", "thought_signature")]
    return f"[{names[0]}]" if names else None


def render_transcript(contents: Sequence[Mapping[str, Any]]) -> str:
    """The contents as plain text for the summariser (thoughts and signatures left out;
    call ids too: they are made up, not facts of the conversation)."""
    out = []
    for content in contents:
        lines = [line for p in parts_of(content) if (line := part_line(p))]
        if lines:
            out.append(f"## {role_of(content)}\n" + "\n".join(lines))
    return "\n\n".join(out)


def head_text(content: Mapping[str, Any]) -> str:
    """The content's leading text: its first non-blank text part, else its first
    transcript line, else its role."""
    for part in parts_of(content):
        text = field(part, "text")
        if isinstance(text, str) and text.strip() and not is_thought(part):
            return text
    lines = render_transcript([content]).splitlines()
    return lines[1] if len(lines) > 1 else role_of(content)


# -- token estimates -----------------------------------------------------------------------

# Media, as Gemini 3 models count it (the media_resolution docs): an image is 1,120 tokens
# at the default (high) resolution, whatever its size; a PDF page 560 (medium, the PDF
# default). A part may name its own resolution. Gemini 2.x counts images by 768-pixel
# tiles of 258 tokens: the larger of the two is taken, so no model is undercounted.
IMAGE_TOKENS = {"low": 280, "medium": 560, "high": 1120, "ultra_high": 2240}
DEFAULT_IMAGE_TOKENS = IMAGE_TOKENS["high"]
PDF_PAGE_TOKENS = 560
TILE_PIXELS, TILE_TOKENS, SMALL_IMAGE_PIXELS = 768, 258, 384
# Audio is 32 tokens a second and video 263 (frames and sound): from the bytes, at
# 128 kbit/s of audio (16 KB a second) and 1 Mbit/s of video (125 KB a second).
AUDIO_BYTES_PER_TOKEN = 16_000 // 32
VIDEO_BYTES_PER_TOKEN = 125_000 // 263
# A file given by URI is not here to measure: a minute of audio or video, five PDF pages.
UNSEEN_AUDIO_TOKENS = 60 * 32
UNSEEN_VIDEO_TOKENS = 60 * 263
UNSEEN_OTHER_TOKENS = DEFAULT_IMAGE_TOKENS


def _resolution(part: Part) -> int | None:
    setting = field(part, "mediaResolution")
    level = field(setting, "level") if isinstance(setting, dict) else setting
    if not isinstance(level, str):
        return None
    return IMAGE_TOKENS.get(level.lower().removeprefix("media_resolution_"))


def _tiles(data: str) -> int:
    size = dimensions_from_base64(data)
    if size is None:
        return 0
    width, height = size
    if width <= SMALL_IMAGE_PIXELS and height <= SMALL_IMAGE_PIXELS:
        return TILE_TOKENS
    return -(-width // TILE_PIXELS) * -(-height // TILE_PIXELS) * TILE_TOKENS


def _base64_bytes(data: str) -> int:
    return len(data) * 3 // 4


def media_tokens(part: Part, blob: Mapping[str, Any], counter: TokenCounter) -> int:
    """Tokens of an inlineData or fileData part, by its MIME type."""
    kind = str(field(blob, "mimeType") or "").lower()
    data = field(blob, "data")
    resolution = _resolution(part)
    if kind.startswith("image/"):
        if resolution is not None:
            return resolution
        return max(DEFAULT_IMAGE_TOKENS, _tiles(data) if isinstance(data, str) else 0)
    if kind == "application/pdf":
        per_page = resolution or PDF_PAGE_TOKENS
        if not isinstance(data, str):
            return PDF_UNKNOWN_PAGES * per_page
        pages = -(-pdf_tokens_from_base64(data) // PDF_TOKENS_PER_PAGE)
        return pages * per_page
    if not isinstance(data, str):
        if kind.startswith("audio/"):
            return UNSEEN_AUDIO_TOKENS
        return UNSEEN_VIDEO_TOKENS if kind.startswith("video/") else UNSEEN_OTHER_TOKENS
    if kind.startswith("audio/"):
        return max(1, _base64_bytes(data) // AUDIO_BYTES_PER_TOKEN)
    if kind.startswith("video/"):
        return max(1, _base64_bytes(data) // VIDEO_BYTES_PER_TOKEN)
    if kind.startswith("text/") or kind in ("application/json", "application/x-python"):
        try:
            return counter.count_text(base64.b64decode(data).decode("utf-8", "replace"))
        except (binascii.Error, ValueError):
            pass
    return max(1, _base64_bytes(data) // 4)


class GeminiCounter(FormatCounter):
    """Token estimates for Gemini contents, on top of the shared counter (and its cache).
    Estimates, like the other formats': calibration against the usage the API reports
    corrects them. Thought signatures are not model input and cost nothing."""

    def count_message(self, message: Mapping[str, Any]) -> int:
        if not isinstance(message, dict):
            return MESSAGE_OVERHEAD + self.base.count_json(message)
        return MESSAGE_OVERHEAD + self.count_content(message.get("parts"))

    def count_content(self, content: object) -> int:
        """A list of parts (or a content object's parts)."""
        if isinstance(content, dict):
            content = content.get("parts")
        if not isinstance(content, list):
            return 0 if content is None else self.base.count_json(content)
        return sum(self.count_block(part) for part in content)

    def count_block(self, block: object) -> int:
        """One part."""
        if not isinstance(block, dict):
            return self.base.count_json(block)
        text = field(block, "text")
        if isinstance(text, str):
            return self.base.count_text(text)
        call = field(block, "functionCall")
        if isinstance(call, dict):
            name = call.get("name")
            named = self.base.count_text(name) if isinstance(name, str) else 0
            return TOOL_FRAMING + named + self.base.count_json(call.get("args", {}))
        response = field(block, "functionResponse")
        if isinstance(response, dict):
            return self._response(response)
        for name in ("inlineData", "fileData"):
            blob = field(block, name)
            if isinstance(blob, dict):
                return media_tokens(block, blob, self.base)
        rest = {
            k: v for k, v in block.items() if k not in ("thoughtSignature", "thought_signature")
        }
        return self.base.count_json(rest) if rest else 0

    def _response(self, response: Mapping[str, Any]) -> int:
        name = response.get("name")
        named = self.base.count_text(name) if isinstance(name, str) else 0
        text = response_text(response)
        body = self.base.count_text(text) if text is not None else 0
        media = response.get("parts")
        if isinstance(media, list):
            body += self.count_content(media)
        return TOOL_FRAMING + named + body

    def count_system(self, system: object) -> int:
        return self.count_content(system) if isinstance(system, dict) else 0

    def count_request(self, body: Mapping[str, Any]) -> int:
        """The whole request: system instruction, tools and contents."""
        contents = body.get("contents")
        listed = contents if isinstance(contents, list) else []
        return (
            self.count_system(field(body, "systemInstruction"))
            + self.count_tools(body.get("tools"))
            + sum(self.count_message(c) for c in listed)
        )
