"""Pick the blob codec by measurement on agent-like tool output.

The corpus is what coding agents offload, taken from this machine so the run needs no
download: logs (the agent-request fixtures' command output, dpkg's log, `git log --stat`,
the scripted agent's build log), code (Python sources of installed packages, C headers),
JSON (`pip inspect`, the recorded request bodies, npm's package.json files) and the
fixtures' replaced prose (random words: a hard case). Each source is cut into blobs of 8,
32 and 128 KB (offloading starts near 8 KB). For each codec: the compressed size over the
raw size (all blobs, and per kind), and compression and decompression speed in MB/s of
raw text on one core.

    .venv/bin/python bench/codec.py
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.testing.agent import tool_output  # noqa: E402

FIXTURES = Path("/work/shared/fixtures/agent-requests")
SIZES = (8_000, 32_000, 128_000)
PER_SOURCE = 400_000  # characters taken from each source at most


def _run(*command: str) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""


def _files(pattern: str, limit: int) -> str:
    out: list[str] = []
    size = 0
    for name in sorted(glob.glob(pattern, recursive=True)):
        try:
            text = Path(name).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        out.append(text)
        size += len(text)
        if size >= limit:
            break
    return "".join(out)


def _fixture_texts(kind: str) -> str:
    """Tool output inside the recorded requests: Codex's command output, Claude's prose."""
    out = []
    for name in sorted(FIXTURES.glob("*.json")):
        body = json.loads(name.read_text())
        body = body.get("body", body)
        for item in body.get("input", []):
            if kind == "logs" and item.get("type") == "function_call_output":
                out.append(str(item.get("output", "")))
        for message in body.get("messages", []):
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if kind == "prose" and block.get("type") == "tool_result":
                    inner = block.get("content")
                    out.append(inner if isinstance(inner, str) else json.dumps(inner))
    return "\n".join(out)


def sources() -> dict[str, dict[str, str]]:
    site = next(iter(glob.glob(str(ROOT / ".venv/lib/python*/site-packages"))), "")
    agent = "".join(tool_output(t, 32_000) for t in range(13))
    return {
        "logs": {
            "command output (fixtures)": _fixture_texts("logs"),
            "dpkg.log": _files("/var/log/dpkg.log", PER_SOURCE),
            "git log --stat": _run("git", "-C", str(ROOT), "log", "--stat", "-n", "300"),
            "scripted agent build log": agent,
        },
        "code": {
            "python (aiohttp, redis)": _files(f"{site}/aiohttp/*.py", PER_SOURCE)
            + _files(f"{site}/redis/**/*.py", PER_SOURCE),
            "C headers": _files("/usr/include/**/*.h", PER_SOURCE),
        },
        "json": {
            "pip inspect": _run(str(ROOT / ".venv/bin/pip"), "inspect"),
            "request bodies (fixtures)": _files(str(FIXTURES / "*.json"), PER_SOURCE),
            "package.json files": _files("/usr/lib/node_modules/**/package.json", PER_SOURCE),
        },
        "prose": {"replaced prose (fixtures)": _fixture_texts("prose")},
    }


def blobs(text: str) -> Iterator[bytes]:
    text = text[:PER_SOURCE]
    for size in SIZES:
        for start in range(0, max(len(text) - size, 0) + 1, size):
            piece = text[start : start + size]
            if len(piece) >= SIZES[0] // 2:
                yield piece.encode()


def codecs() -> dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]]:
    found: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {}
    for level in (1, 6, 9):
        found[f"zlib-{level}"] = (lambda b, lv=level: zlib.compress(b, lv), zlib.decompress)
    try:
        import zstandard
    except ImportError:
        return found
    for level in (1, 3, 6, 9, 19):
        c = zstandard.ZstdCompressor(level=level)
        d = zstandard.ZstdDecompressor()
        found[f"zstd-{level}"] = (c.compress, d.decompress)
    return found


def measure(
    corpus: dict[str, list[bytes]],
    pack: Callable[[bytes], bytes],
    unpack: Callable[[bytes], bytes],
) -> tuple[dict[str, float], float, float]:
    ratios: dict[str, float] = {}
    raw_all = packed_all = 0
    pack_s = unpack_s = 0.0
    for kind, items in corpus.items():
        raw = packed = 0
        for item in items:
            began = time.perf_counter()
            small = pack(item)
            pack_s += time.perf_counter() - began
            began = time.perf_counter()
            assert unpack(small) == item
            unpack_s += time.perf_counter() - began
            raw += len(item)
            packed += len(small)
        ratios[kind] = packed / raw
        raw_all += raw
        packed_all += packed
    ratios["all"] = packed_all / raw_all
    return ratios, raw_all / pack_s / 1e6, raw_all / unpack_s / 1e6


def main() -> None:
    corpus: dict[str, list[bytes]] = {}
    for kind, named in sources().items():
        corpus[kind] = [b for text in named.values() for b in blobs(text)]
        sizes = ", ".join(f"{name} {len(text) // 1000} KB" for name, text in named.items())
        print(f"{kind}: {len(corpus[kind])} blobs from {sizes}")
    kinds = list(corpus)
    print()
    print("| codec | " + " | ".join(kinds) + " | all | compress MB/s | decompress MB/s |")
    print("|---" * (len(kinds) + 4) + "|")
    for name, (pack, unpack) in codecs().items():
        best: tuple[dict[str, float], float, float] | None = None
        for _ in range(3):  # the fastest of 3 runs: the machine is shared
            run = measure(corpus, pack, unpack)
            if best is None or run[1] > best[1]:
                best = (run[0], run[1], max(run[2], best[2] if best else 0.0))
        assert best is not None
        ratios, c_speed, d_speed = best
        cells = " | ".join(f"{ratios[k]:.3f}" for k in [*kinds, "all"])
        print(f"| {name} | {cells} | {c_speed:.0f} | {d_speed:.0f} |")


if __name__ == "__main__":
    main()
