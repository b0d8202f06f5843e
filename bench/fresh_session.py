"""A recorded session replayed as many conversations: the same structure, fresh content.

Each conversation sends the recorded session's main-loop requests (bench/session_file.py)
in order, with what makes a conversation its own changed consistently in every request:
each tool result's words are replaced by words of the same length drawn from the
session's own results (as often as each occurs there, so the tokens stay about what they
were: within 1% on the recorded session; by a keyed hash of the word, so a word repeats
where it repeated), so every conversation reads as another codebase's output with the
same bytes, lines and layout; the tool call ids are new, and so is the session id
(header and metadata). The
messages, their order, the cache markers, system, tools and options are as recorded, and
the bodies are re-encoded with orjson, which gives the recorded bytes back unchanged
(checked when the session is loaded).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from session_file import Recorded, read_session

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "bench" / "sessions" / "claude-code-opus-5-5.zst"
MAIN_LOOP = ("tool", "text")  # the stand-in's kinds of the agent's own turns
WORD = re.compile(r"[A-Za-z]{2,}")
SESSION_HEADER = "x-claude-code-session-id"


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes


class FreshSessions:
    """The recorded session's main loop, and fresh conversations made of it."""

    def __init__(self, path: Path = SESSION) -> None:
        self.path = path
        recorded = [r for r in read_session(path) if r.kind in MAIN_LOOP]
        self.recorded: list[Recorded] = recorded
        self.bodies = [orjson.loads(r.body) for r in recorded]
        for r, body in zip(recorded, self.bodies, strict=True):
            if orjson.dumps(body) != r.body:
                raise ValueError(f"{path}: a body orjson does not give back byte for byte")
        self.session_id = _header(recorded[0].headers, SESSION_HEADER)
        # Every occurrence of a word, so that common words are drawn as often as they occur
        # (the replaced text then costs about the tokens the recorded one did).
        by_length: dict[int, list[str]] = defaultdict(list)
        for text in _result_texts(self.bodies[-1]):  # the last request holds every result
            for word in WORD.findall(text):
                by_length[len(word)].append(word)
        self.words = {n: sorted(words) for n, words in by_length.items()}

    def __len__(self) -> int:
        return len(self.recorded)

    def conversation(self, name: str, upto: int | None = None) -> Iterator[Request]:
        """The conversation `name`'s requests (the first `upto`), made as they are sent."""
        fresh = _Fresh(self, name)
        for recorded, body in list(zip(self.recorded, self.bodies, strict=True))[:upto]:
            headers = dict(recorded.headers)
            for key in headers:
                if key.lower() == SESSION_HEADER:
                    headers[key] = fresh.session_id
            yield Request(recorded.path, headers, orjson.dumps(fresh.body(body)))


class _Fresh:
    """One conversation's replacements, made once and reused in each of its requests."""

    def __init__(self, sessions: FreshSessions, name: str) -> None:
        self.sessions = sessions
        self.key = hashlib.blake2b(name.encode(), digest_size=16).digest()
        self.session_id = str(uuid.UUID(bytes=self.key))
        self.texts: dict[str, str] = {}
        self.words: dict[str, str] = {}
        self.ids: dict[str, str] = {}

    def _hash(self, value: str) -> int:
        digest = hashlib.blake2b(value.encode(), key=self.key, digest_size=8).digest()
        return int.from_bytes(digest, "big")

    def _word(self, match: re.Match[str]) -> str:
        word = match.group()
        fresh = self.words.get(word)
        if fresh is None:
            choices = self.sessions.words.get(len(word)) or [word]
            fresh = self.words[word] = choices[self._hash(word) % len(choices)]
        return fresh

    def text(self, text: str) -> str:
        fresh = self.texts.get(text)
        if fresh is None:
            fresh = self.texts[text] = WORD.sub(self._word, text)
        return fresh

    def id(self, old: str) -> str:
        fresh = self.ids.get(old)
        if fresh is None:
            tail = hashlib.blake2b(old.encode(), key=self.key).hexdigest()
            fresh = self.ids[old] = ("toolu_" + tail)[: len(old)]
        return fresh

    def body(self, body: dict[str, Any]) -> dict[str, Any]:
        out = dict(body)
        out["messages"] = [self.message(m) for m in body["messages"]]
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
            user = metadata["user_id"].replace(self.sessions.session_id, self.session_id)
            out["metadata"] = {**metadata, "user_id": user}
        return out

    def message(self, message: dict[str, Any]) -> dict[str, Any]:
        content = message.get("content")
        if not isinstance(content, list):
            return message
        return {**message, "content": [self.block(b) for b in content]}

    def block(self, block: Any) -> Any:
        if not isinstance(block, dict):
            return block
        kind = block.get("type")
        if kind == "tool_use":
            return {**block, "id": self.id(block["id"])}
        if kind != "tool_result":
            return block
        out = {**block, "tool_use_id": self.id(block["tool_use_id"])}
        content = block.get("content")
        if isinstance(content, str):
            out["content"] = self.text(content)
        elif isinstance(content, list):
            out["content"] = [
                {**c, "text": self.text(c["text"])} if c.get("type") == "text" else c
                for c in content
            ]
        return out


def _header(headers: dict[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name), "")


def _result_texts(body: dict[str, Any]) -> Iterator[str]:
    for message in body.get("messages", []):
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, str):
                    yield inner
                elif isinstance(inner, list):
                    yield from (c["text"] for c in inner if c.get("type") == "text")
