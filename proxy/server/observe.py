"""What happened to the request being handled, noted from anywhere below the handler.

The metrics middleware opens a `RequestRecord` per request and makes it current (a
context variable, so it follows the handler's task and the tasks it spawns). Code deep
in the pipeline notes events with the one-line functions below, without the app, the
registry or the request being passed down; with no record current (benchmarks, the
replay command) they do nothing. Only numbers and fixed words are recorded, never
prompt text or credentials.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    route: str
    method: str
    started: float = field(default_factory=time.perf_counter)
    upstream_sent: float | None = None  # perf_counter when the upstream request went out
    upstream_answered: float | None = None  # ... and when its response headers came
    interception_seconds: float = 0.0  # read_result work between rounds
    usage: dict[str, int] = field(default_factory=dict)  # summed over upstream rounds
    read_rounds: int = 0
    strategy: str = ""  # the Compactor's, "refuse", or "" (untouched)
    tokens_before: int = 0
    tokens_after: int = 0
    offloaded: int = 0  # results newly offloaded by this request
    summary: str = ""  # "made", "reused" or ""
    summariser_calls: int = 0
    summariser_failures: int = 0
    upstream_request_id: str = ""
    # For the admin stats (proxy/server/admin/stats.py): ids and fixed words only.
    model: str = ""  # the model the client asked for
    conversation: str = ""  # the conversation id (a keyed hash, proxy/core/identity.py)
    key_id: str = ""
    team: str = ""
    rejected: str = ""  # why a key or budget check refused the request ("tokens", ...)
    first_answer_usage: dict[str, int] = field(default_factory=dict)  # before read rounds
    summariser_usage: dict[str, int] = field(default_factory=dict)

    def own_seconds(self, ended: float) -> float:
        """The proxy's own time: before the upstream request went out, plus the work
        between read_result rounds (all of it when nothing was sent upstream)."""
        before = (self.upstream_sent if self.upstream_sent is not None else ended) - self.started
        return before + self.interception_seconds


_current: ContextVar[RequestRecord | None] = ContextVar("compaction_proxy_request", default=None)


def begin(record: RequestRecord) -> Any:
    return _current.set(record)


def end(token: Any) -> None:
    _current.reset(token)


def current() -> RequestRecord | None:
    return _current.get()


def relayed_usage() -> dict[str, int]:
    """The usage found in the current request's relayed answer so far (normalised to
    the Messages names), or {} outside a request."""
    record = _current.get()
    return dict(record.usage) if record is not None else {}


def upstream_sending() -> None:
    record = _current.get()
    if record is not None and record.upstream_sent is None:
        record.upstream_sent = time.perf_counter()


def upstream_answered(request_id: str = "") -> None:
    record = _current.get()
    if record is not None and record.upstream_answered is None:
        record.upstream_answered = time.perf_counter()
        record.upstream_request_id = request_id[:64]


def interception(seconds: float) -> None:
    record = _current.get()
    if record is not None:
        record.interception_seconds += seconds


def read_round() -> None:
    record = _current.get()
    if record is not None:
        record.read_rounds += 1


def rewrite(strategy: str, before: int, after: int, offloaded: int, summary: str) -> None:
    record = _current.get()
    if record is not None:
        record.strategy = strategy
        record.tokens_before, record.tokens_after = before, after
        record.offloaded, record.summary = offloaded, summary


def refused() -> None:
    record = _current.get()
    if record is not None:
        record.strategy = "refuse"


def caller(key_id: str, team: str | None) -> None:
    record = _current.get()
    if record is not None:
        record.key_id, record.team = key_id, team or ""


def conversation(model: str, conversation_id: str) -> None:
    record = _current.get()
    if record is not None:
        record.model, record.conversation = model, conversation_id


def rejected(reason: str) -> None:
    record = _current.get()
    if record is not None:
        record.rejected = reason


def summariser_usage(usage: Mapping[str, Any]) -> None:
    record = _current.get()
    if record is not None:
        for key, value in normalised(usage).items():
            record.summariser_usage[key] = record.summariser_usage.get(key, 0) + value


def summariser_call(failed: bool = False) -> None:
    """Count one summariser call when it is made; `failed=True` marks its failure."""
    record = _current.get()
    if record is not None:
        if failed:
            record.summariser_failures += 1
        else:
            record.summariser_calls += 1


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def normalised(usage: Mapping[str, Any]) -> dict[str, int]:
    """Anthropic usage as it is; OpenAI usage (prompt_tokens with cached_tokens inside,
    completion_tokens) in Anthropic's terms: uncached input, cache reads, output."""
    if "prompt_tokens" not in usage and "completion_tokens" not in usage:
        return {k: _count(usage[k]) for k in USAGE_KEYS if k in usage}
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    return {
        "input_tokens": max(0, _count(usage.get("prompt_tokens")) - cached),
        "cache_read_input_tokens": cached,
        "output_tokens": _count(usage.get("completion_tokens")),
    }


def add_usage(usage: Mapping[str, Any] | None) -> None:
    """Add one upstream answer's usage (a round of a read_result loop is one answer)."""
    record = _current.get()
    if record is None or not isinstance(usage, Mapping):
        return
    found = normalised(usage)
    if record.read_rounds == 0:  # a read_result loop's first answer (what was asked)
        record.first_answer_usage = found
    for key, value in found.items():
        record.usage[key] = record.usage.get(key, 0) + value


_USAGE_FIELD = re.compile(
    rb'"(input_tokens|output_tokens|cache_creation_input_tokens|cache_read_input_tokens'
    rb'|prompt_tokens|completion_tokens|cached_tokens)"\s*:\s*(\d+)'
)


def usage_in(data: bytes) -> dict[str, int]:
    """The usage numbers in a piece of a relayed answer, found without parsing it (the
    first occurrence of each: a message's own `usage` comes before nested ones)."""
    found: dict[str, Any] = {}
    for name, value in _USAGE_FIELD.findall(data):
        found.setdefault(name.decode(), int(value))
    if "cached_tokens" in found:  # OpenAI's, nested in prompt_tokens_details
        found["prompt_tokens_details"] = {"cached_tokens": found.pop("cached_tokens")}
    return normalised(found)


def relayed_head(chunk: bytes) -> None:
    """Usage from the first bytes of a relayed answer: a whole JSON body (all of it) or
    a stream's message_start (input and cache counts; output comes at the end)."""
    record = _current.get()
    if record is None:
        return
    if chunk.startswith(b"data:"):
        return  # an OpenAI stream: usage, if asked for, comes in the last chunk
    if chunk.startswith(b"event:"):  # Anthropic's message_start
        found = usage_in(chunk[:8192])
        found.pop("output_tokens", None)
    else:
        found = usage_in(chunk[-4096:])
    add_usage(found)


def relayed_tail(tail: bytes) -> None:
    """Usage from the last bytes of a relayed stream: message_delta's output count (and
    the final input counts when the upstream repeats them there)."""
    record = _current.get()
    if record is None:
        return
    at = tail.rfind(b"message_delta")
    if at < 0:  # an OpenAI stream: usage, if asked for, comes in the last chunk
        at = tail.rfind(b'"usage":{')
        if at >= 0:
            add_usage(usage_in(tail[at:]))
        return
    found = usage_in(tail[at:])
    for key, value in found.items():
        if key == "output_tokens":
            record.usage[key] = record.usage.get(key, 0) + value
        else:  # a final count replaces the one message_start announced
            record.usage[key] = value
