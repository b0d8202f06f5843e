"""Reading saved requests: a Messages body, a recorded request, or a trace of them.

A request file is either a JSON body (an object with `messages`, or with `input` for the
Responses API) or a recorded
request `{"method", "path", "headers", "body"}` as in tests/fixtures/agent-requests/
(the body an object, or a JSON string of one). A trace is a JSONL file with one such
request per line, or a directory of request files taken in natural name order
(turn2.json before turn10.json). Any of these files may be gzip-compressed (`.gz`), as
traces are usually kept.
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


class RequestFileError(ValueError):
    """A file that holds no Messages request; the message says where and why."""


def body_of(value: Any, where: str) -> dict[str, Any]:
    """The body of a parsed request file or trace line."""
    if isinstance(value, dict) and not _is_body(value) and "body" in value:
        value = value["body"]
        if isinstance(value, (str, bytes)):
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError as e:
                raise RequestFileError(f"{where}: the recorded body is not JSON: {e}") from None
    if not isinstance(value, dict) or not _is_body(value):
        raise RequestFileError(
            f"{where}: not a Messages request (a JSON object with a `messages` list, or"
            " `input` for the Responses API, or a recorded request with such a `body`)"
        )
    return value


def _is_body(value: dict[str, Any]) -> bool:
    return isinstance(value.get("messages"), list) or isinstance(value.get("input"), (list, str))


def _open(path: Path) -> io.BufferedIOBase:
    """The file's bytes, decompressed when its name ends in .gz."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return path.open("rb")


def _read(path: Path) -> bytes:
    if path.is_dir():
        raise RequestFileError(
            f"{path}: a directory (a trace?); this command takes one request:"
            f" `compaction-proxy replay {path}` runs a whole conversation"
        )
    try:
        with _open(path) as f:
            return f.read()
    except gzip.BadGzipFile:
        raise RequestFileError(f"{path}: named .gz but not gzip-compressed") from None
    except (OSError, EOFError) as e:
        raise RequestFileError(f"{path}: {getattr(e, 'strerror', None) or e}") from None


def _requests_per_line(raw: bytes) -> int:
    """How many JSON objects the bytes hold one per line (0: not a JSONL trace)."""
    lines = [line for line in raw.splitlines() if line.strip()]
    if len(lines) < 2:
        return 0
    try:
        orjson.loads(lines[0])
    except orjson.JSONDecodeError:
        return 0
    return len(lines)


def load_request(path: Path) -> dict[str, Any]:
    raw = _read(path)
    try:
        return body_of(orjson.loads(raw), str(path))
    except orjson.JSONDecodeError as e:
        n = _requests_per_line(raw)
        if n:
            raise RequestFileError(
                f"{path}: a trace of {n} requests, one per line; this command takes one"
                f" request: `compaction-proxy replay {path}` runs a whole conversation"
            ) from None
        raise RequestFileError(f"{path}: not valid JSON: {e}") from None


def recorded_betas(path: Path) -> str:
    """The `anthropic-beta` header of a recorded `{method, path, headers, body}` request
    file ("" for a bare body, or a file that is not one request)."""
    try:
        value = orjson.loads(_read(path))
    except (orjson.JSONDecodeError, RequestFileError):
        return ""
    return _betas_of(value)


def trace_betas(path: Path) -> str:
    """The `anthropic-beta` header of a trace's first request, where it is recorded with
    its headers (a client sends the same betas with every request); "" otherwise."""
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if _is_request_file(p)), key=_natural)
        return recorded_betas(files[0]) if files else ""
    try:
        with _open(path) as f:
            line = next((line for line in f if line.strip()), b"")
        return _betas_of(orjson.loads(line)) if line else ""
    except (OSError, EOFError, gzip.BadGzipFile, orjson.JSONDecodeError):
        return ""  # (load_trace says what is wrong with the file)


def _betas_of(value: Any) -> str:
    headers = value.get("headers") if isinstance(value, dict) else None
    if isinstance(headers, dict):
        pairs: list[Any] = list(headers.items())
    elif isinstance(headers, list):
        pairs = headers
    else:
        return ""
    found = []
    for pair in pairs:
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            name, text = pair
            if str(name).lower() == "anthropic-beta" and isinstance(text, str):
                found.append(text)
    return ",".join(found)


def _is_request_file(path: Path) -> bool:
    return path.name.endswith((".json", ".json.gz"))


def _natural(path: Path) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def trace_length(path: Path) -> int:
    """How many requests a trace holds (for a progress bar), without parsing them."""
    if path.is_dir():
        return sum(1 for p in path.iterdir() if _is_request_file(p))
    try:
        with _open(path) as f:
            return sum(1 for line in f if line.strip())
    except (OSError, EOFError) as e:
        raise RequestFileError(f"{path}: {getattr(e, 'strerror', None) or e}") from None


def load_trace(path: Path) -> Iterator[dict[str, Any]]:
    """The trace's request bodies, in order, one at a time (a trace can be large)."""
    if not path.exists():
        raise RequestFileError(f"{path}: no such file or directory")
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if _is_request_file(p)), key=_natural)
        if not files:
            raise RequestFileError(f"{path}: no .json request files in this directory")
        for file in files:
            yield load_request(file)
        return
    try:
        with _open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    raise RequestFileError(f"{path}:{n}: not valid JSON: {e}") from None
                yield body_of(value, f"{path}:{n}")
    except gzip.BadGzipFile:
        raise RequestFileError(f"{path}: named .gz but not gzip-compressed") from None
    except (OSError, EOFError) as e:  # a truncated .gz ends in EOFError
        raise RequestFileError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
