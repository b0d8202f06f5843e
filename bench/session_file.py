"""A recorded agent session: every request an agent sent, kept compactly.

An agent sends its whole history with every request, so request n is mostly request
n-1's bytes: each request is stored as the bytes it shares with an earlier one at its
start and at its end (`head`, `tail`) and the bytes in between (`middle`), and the whole
file is one zstd frame. Claude Code moves one cache marker off the newest message each
turn and puts `system` and `tools` after `messages`, so the middle of a turn is its new
messages plus a few bytes around the moved marker.

The file: one JSON line describing the session, then for each request a JSON line (its
method, path, headers, the kind the stand-in took it for, and `base`, `head`, `tail`,
`middle` in bytes) followed by the middle's bytes and a newline.

    requests = read_session(path)   # [Recorded(method, path, headers, kind, body)]
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zstandard

FORMAT = "compaction-proxy recorded session 1"
LEVEL = 19
# How far back a request looks for the earlier request it shares the most bytes with
# (a side request or a token count can come between two turns of the main loop).
LOOKBACK = 4


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str  # path and query, as sent
    headers: dict[str, str]
    kind: str  # what the stand-in took it for (proxy/testing/scenario.py), "" if nothing
    body: bytes


def _shared(base: bytes, body: bytes) -> tuple[int, int]:
    """Bytes body shares with base at its start, then at its end (not overlapping)."""
    # (Imported here: reading a session needs no proxy tree, e.g. under another version's.)
    from proxy.core.unchanged import common_prefix, common_suffix

    head = common_prefix(base, body)
    return head, common_suffix(base, body, min(len(base), len(body)) - head)


def write_session(path: Path, meta: Mapping[str, Any], requests: Sequence[Recorded]) -> None:
    out = io.BytesIO()
    out.write(orjson.dumps({"format": FORMAT, **meta, "requests": len(requests)}) + b"\n")
    for n, request in enumerate(requests):
        base, head, tail = -1, 0, 0
        for earlier in range(max(0, n - LOOKBACK), n):
            h, t = _shared(requests[earlier].body, request.body)
            if h + t > head + tail:
                base, head, tail = earlier, h, t
        middle = request.body[head : len(request.body) - tail]
        line = {
            "method": request.method,
            "path": request.path,
            "headers": request.headers,
            "kind": request.kind,
            "base": base,
            "head": head,
            "tail": tail,
            "middle": len(middle),
        }
        out.write(orjson.dumps(line) + b"\n" + middle + b"\n")
    path.write_bytes(zstandard.ZstdCompressor(level=LEVEL).compress(out.getvalue()))


def read_meta(path: Path) -> dict[str, Any]:
    """The session's first line (what recorded it, when, how), without the requests. (A
    zstandard stream reader has no readline: it raised io.UnsupportedOperation.)"""
    with zstandard.ZstdDecompressor().stream_reader(path.read_bytes()) as reader:
        head = reader.read(1 << 16)  # the line is a few hundred bytes
    meta: dict[str, Any] = orjson.loads(head[: head.index(b"\n")])
    return meta


def read_session(path: Path) -> list[Recorded]:
    data = zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read()
    at = data.index(b"\n") + 1
    meta = orjson.loads(data[:at])
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a recorded session ({meta.get('format')!r})")
    requests: list[Recorded] = []
    for _ in range(meta["requests"]):
        end = data.index(b"\n", at)
        line = orjson.loads(data[at:end])
        at = end + 1
        middle = data[at : at + line["middle"]]
        at += line["middle"] + 1
        body = middle
        if line["base"] >= 0:
            base = requests[line["base"]].body
            body = base[: line["head"]] + middle + base[len(base) - line["tail"] :]
        request = Recorded(line["method"], line["path"], line["headers"], line["kind"], body)
        requests.append(request)
    return requests
