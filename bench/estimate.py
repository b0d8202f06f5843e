"""What a cheaper token estimate costs in accuracy: bytes per token against tiktoken.

For tool-result-sized pieces (3-9 KB and 32 KB) of bench/codec.py's corpus (logs, code,
JSON, prose), the exact count (proxy/core/tokens.py, cl100k) against: a bytes / rho
estimate with rho calibrated on the whole corpus (what the proxy's calibration would
converge to on this traffic), and the two hard bounds the proxy can use without
encoding: UTF-8 bytes (an upper bound: every token is at least one byte) and ASCII-
whitespace-separated words (a lower bound: no token spans two of them). Prints, per
kind, bytes per token (mean, p1, p99), the estimate's error (p50, p99, worst) and how far
the hard bounds sit from the count, and the CPU of the count and of the estimate.

    .venv/bin/python bench/estimate.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from codec import sources  # noqa: E402

from proxy.core.tokens import TokenCounter  # noqa: E402


def pieces(text: str, seed: int) -> list[str]:
    out = []
    start = 0
    n = 0
    while start < len(text) and len(out) < 300:
        size = 32_000 if n % 5 == 4 else 3_000 + ((seed + n) * 7919) % 6_000
        piece = text[start : start + size]
        if len(piece) >= 1_000:
            out.append(piece)
        start += size
        n += 1
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    counter = TokenCounter(cache_size=0)
    kinds: dict[str, list[tuple[int, int, int]]] = {}
    spent = 0.0
    bytes_total = 0
    for seed, (kind, named) in enumerate(sources().items()):
        rows = kinds.setdefault(kind, [])
        for text in named.values():
            for piece in pieces(text, seed):
                data = piece.encode()
                began = time.process_time()
                tokens = counter.count_text(piece)
                spent += time.process_time() - began
                bytes_total += len(data)
                rows.append((tokens, len(data), len(data.split())))
    every = [row for rows in kinds.values() for row in rows]
    rho = sum(b for _, b, _ in every) / sum(t for t, _, _ in every)
    began = time.process_time()
    for _ in range(20):
        for _, b, _ in every:
            round(b / rho)
    estimate_cpu = (time.process_time() - began) / 20
    print(
        f"pieces: {len(every)}, {bytes_total / 1e6:.1f} MB; calibrated rho = {rho:.2f} bytes/token"
    )
    print(
        f"exact count: {spent * 1e3:.0f} ms CPU ({bytes_total / spent / 1e6:.1f} MB/s); "
        f"bytes/rho: {estimate_cpu * 1e3:.2f} ms"
    )
    print()
    print(
        "| kind | pieces | bytes/token mean (p1-p99) | bytes/rho error p50 / p99 / worst "
        "| bytes / tokens (upper bound) p50 | tokens / words (lower bound) p50 |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for kind, rows in [*kinds.items(), ("all", every)]:
        ratios = [b / t for t, b, _ in rows]
        errors = [abs(b / rho - t) / t for t, b, _ in rows]
        over = [b / t for t, b, _ in rows]
        under = [t / max(1, w) for t, _, w in rows]
        print(
            f"| {kind} | {len(rows)} | {statistics.mean(ratios):.2f} "
            f"({pct(ratios, 0.01):.2f}-{pct(ratios, 0.99):.2f}) "
            f"| {100 * pct(errors, 0.5):.0f}% / {100 * pct(errors, 0.99):.0f}% / "
            f"{100 * max(errors):.0f}% | {pct(over, 0.5):.2f}x | {pct(under, 0.5):.2f}x |"
        )


if __name__ == "__main__":
    main()
