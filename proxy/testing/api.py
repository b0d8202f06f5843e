"""What the stand-in needs of one API: how its requests read, how its answers and errors
look. The pipeline (answering.py) is the same for every API; an `Api` fills in the rest.

An API is a reader (a valid body as a neutral `Prompt`), a renderer (a neutral `Reply`
and `Usage` as the API's JSON answer and stream events) and its rules (credentials,
validation, counting, the window, errors in its own shape). See the package docstring
for how to add one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.testing.cache import Unit
from proxy.testing.prompt import Prompt
from proxy.testing.reply import Reply, Usage
from proxy.testing.script import Script


@dataclass(frozen=True)
class Refusal:
    """An error answer, before the API shapes it."""

    status: int
    kind: str  # the error's type, in the API's words
    message: str
    param: str | None = None
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    """One event of a streamed answer. `kind` says where the script's delays and faults
    apply: "start" (a stall holds after it), "delta" (paced; a cut strikes after the
    first), "end" (not sent when a cut strikes first), anything else ("block", "ping")."""

    kind: str
    data: bytes  # its JSON (or Chat's `[DONE]`)
    name: str | None = None  # the SSE event name; None: a data-only event

    def sse(self) -> bytes:
        if self.name is None:
            return b"data: " + self.data + b"\n\n"
        return b"event: " + self.name.encode() + b"\ndata: " + self.data + b"\n\n"


def event(kind: str, name: str | None, data: Any) -> Event:
    return Event(kind, orjson.dumps(data), name)


@dataclass(frozen=True)
class Streamed:
    """An answer to stream: its events, the script's delays and the fault that strikes
    (and the event a `stream_error` fault sends)."""

    events: list[Event]
    script: Script
    fault: str | None
    fault_event: Event | None


@dataclass(frozen=True)
class Whole:
    """A JSON answer (as sent, and as an object), and the fault that strikes it."""

    payload: bytes
    script: Script
    fault: str | None
    answer: dict[str, Any]


class Api(ABC):
    """One API's part of the stand-in. Methods get valid bodies unless they say so."""

    # A short name; with the body, what fixes the answer (the answers of a body are
    # memoised under it: an API whose path names the model puts the model in it too).
    name: str
    ignored: tuple[str, ...] = ("stream",)  # fields the answer's ids do not depend on
    defaults: Mapping[str, Any] = {}  # script keys under the stand-in's (its model's habits)
    unparsable: str  # the 400's wording for a body that is not JSON: {error}
    faults: Mapping[str, Refusal]  # the status faults ("429", "529", "500") as refusals

    @abstractmethod
    def refuse(self, refusal: Refusal, request_id: str) -> web.Response:
        """The refusal in the API's error shape."""

    def gate(self, headers: Mapping[str, str]) -> Refusal | None:
        """The checks made before anything else (credentials, required headers); None
        where the route checks them itself."""
        return None

    @abstractmethod
    def invalid(self, body: Any) -> Refusal | None:
        """Why the API refuses this parsed body, if it does (before counting)."""

    @abstractmethod
    def count(self, body: Any) -> int:
        """The prompt's tokens by the project's counter (before token_scale)."""

    @abstractmethod
    def units(self, body: Any) -> list[Unit]:
        """The prompt as prompt-cache units (cache.py)."""

    @abstractmethod
    def too_long(self, tokens: int, window: int) -> Refusal | None:
        """The refusal of a prompt of `tokens` over the model's `window`."""

    @abstractmethod
    def read(self, body: Any) -> Prompt:
        """What the script reads of the request."""

    @abstractmethod
    def streaming(self, body: Any) -> bool:
        """Whether the body asks for a stream."""

    @abstractmethod
    def whole(self, body: Any, reply: Reply, usage: Usage) -> dict[str, Any]:
        """The answer as one JSON object."""

    @abstractmethod
    def events(self, body: Any, whole: dict[str, Any], chunk_tokens: int) -> list[Event]:
        """The whole answer as the API streams it (`chunk_tokens` words per text delta)."""

    @abstractmethod
    def recorded(self, whole: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """What the record keeps of an answer: its content and its usage object."""

    @abstractmethod
    def stream_error(self, events: list[Event]) -> Event:
        """The error event a `stream_error` fault sends after the events it let through."""

    def response_headers(
        self, headers: Mapping[str, str], whole: dict[str, Any] | None
    ) -> Mapping[str, str]:
        """Headers of the answer to a request with these headers (`whole`: the JSON answer;
        None for a refusal or a stream)."""
        return {}

    def deferral_refusal(self, body: Any) -> Refusal | None:
        """The refusal of a body that defers or loads a tool (tool search), by an API
        that does not take it (StandInOptions.refuses_deferral); None: it does neither,
        or this API has no such thing."""
        return None

    def model(self, body: Any) -> str:
        """The model asked for (its window applies): the body's, or the path's."""
        return str(body.get("model"))

    def overflow(self, body: Any, refusal: Refusal) -> list[Event] | None:
        """A stream over the window, when the API reports that in a 200 stream."""
        return None

    def scripted(self, prompt: Prompt) -> Mapping[str, Any]:
        """Script keys the request's own content implies (a scenario reading it)."""
        return {}

    def summary_note(self, prompt: Prompt) -> str:
        """A line added to a summary of this request's history ("" for none)."""
        return ""


def text_pieces(text: str, words_per_piece: int) -> list[str]:
    """The text as streamed: pieces of a few words, spaces kept."""
    words = text.split(" ")
    pieces = []
    for i in range(0, len(words), words_per_piece):
        piece = " ".join(words[i : i + words_per_piece])
        pieces.append(piece if i + words_per_piece >= len(words) else piece + " ")
    return pieces


def json_pieces(text: str, chars: int = 24) -> list[str]:
    """A call's JSON arguments as streamed: pieces of `chars` characters."""
    return [text[i : i + chars] for i in range(0, len(text), chars)]
