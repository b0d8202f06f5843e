"""What a cheaper token estimate costs in accuracy: bytes per token against tiktoken.

For tool-result-sized pieces (3-9 KB and 32 KB) of bench/codec.py's corpus (logs, code,
JSON, prose), the exact count (proxy/core/tokens.py, cl100k) against: a bytes / rho
estimate with rho calibrated on the whole corpus (what the proxy's calibration would
converge to on this traffic), and the two hard bounds the proxy can use without
encoding: UTF-8 bytes (an upper bound: every token is at least one byte) and ASCII-
whitespace-separated words (a lower bound: no token spans two of them). Prints, per
kind, bytes per token (mean, p1, p99), the estimate's error (p50, p99, worst) and how far
the hard bounds sit from the count, and the CPU of the count and of the estimate.

    .venv/bin/python bench/estimate.py [--fit]

--fit: the message estimate of proxy/core/estimate.py. Its linear model over byte classes
is fitted (relative least squares) to tiktoken's counts of the corpus's pieces as tool
results and assistant texts, even pieces; it prints the constants, then the estimate's
error on what it was not fitted on: the odd pieces, the recorded Claude Code session
(bench/sessions/) and fresh conversations made of it (bench/fresh_session.py), and which
odd inputs (base64, hex, CJK, minified JSON, runs of spaces, digits) its byte-mix guard
sends to the exact count. With the constants in place, the same run measures them.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from codec import sources  # noqa: E402

from proxy.core import estimate  # noqa: E402
from proxy.core.digests import canonical  # noqa: E402
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


# -- the message estimate (--fit) ------------------------------------------------------

Sample = tuple[str, bytes, int]  # (kind, a message's canonical JSON, its exact count)


def _message_samples(counter: TokenCounter) -> tuple[list[Sample], list[Sample]]:
    """The corpus's pieces as tool results and assistant texts: even pieces to fit, odd
    ones held out."""
    fit: list[Sample] = []
    held: list[Sample] = []
    for seed, (kind, named) in enumerate(sources().items()):
        text = "\n".join(t for t in named.values() if t)
        for n, piece in enumerate(pieces(text, seed)):
            result = {"type": "tool_result", "tool_use_id": f"toolu_{n:024d}", "content": piece}
            messages = [{"role": "user", "content": [result]}]
            if n % 3 == 0:
                messages.append({"role": "assistant", "content": [{"type": "text", "text": piece}]})
            for message in messages:
                data = canonical(message).json
                if len(data) >= estimate.ESTIMATE_MIN_BYTES:
                    sample = (kind, data, counter.count_message(message))
                    (fit if n % 2 == 0 else held).append(sample)
    return fit, held


def _session_samples(counter: TokenCounter) -> list[Sample]:
    from fresh_session import FreshSessions

    sessions = FreshSessions()
    out: list[Sample] = []
    bodies = [("recorded session", sessions.bodies[-1])]
    for name in ("fresh-a", "fresh-b"):
        *_, last = sessions.conversation(name)
        bodies.append(("fresh conversations", orjson.loads(last.body)))
    for kind, body in bodies:
        for message in body["messages"]:
            data = canonical(message).json
            if len(data) >= estimate.ESTIMATE_MIN_BYTES:
                out.append((kind, data, counter.count_message(message)))
    return out


def _fitted(samples: list[Sample]) -> list[float]:
    """Relative least squares: minimise the sum of ((estimate - count) / count)^2."""
    rows = [[1.0, *estimate.byte_classes(data)] for _, data, _ in samples]
    k = len(rows[0])
    a = [[0.0] * (k + 1) for _ in range(k)]
    for row, (_, _, count) in zip(rows, samples, strict=True):
        w = 1.0 / count**2
        for i in range(k):
            a[i][k] += w * row[i] * count
            for j in range(k):
                a[i][j] += w * row[i] * row[j]
    for i in range(k):  # Gauss-Jordan
        pivot = max(range(i, k), key=lambda r: abs(a[r][i]))
        a[i], a[pivot] = a[pivot], a[i]
        for r in range(k):
            if r != i:
                f = a[r][i] / a[i][i]
                a[r] = [x - f * y for x, y in zip(a[r], a[i], strict=True)]
    return [a[i][k] / a[i][i] for i in range(k)]


def _odd_inputs() -> dict[str, str]:
    import base64
    import os

    return {
        "base64": base64.b64encode(os.urandom(15_000)).decode(),
        "hex": os.urandom(8_000).hex(),
        "CJK": "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(6_000)),
        "minified JSON": orjson.dumps([{"id": i, "v": i * 3.14159} for i in range(600)]).decode(),
        "runs of spaces": "    x = 1\n" * 2_000,
        "digits": " ".join(str(i * 7919) for i in range(3_000)),
    }


def fit_estimate() -> None:
    counter = TokenCounter(cache_size=0)
    fit, held = _message_samples(counter)
    coefficients = _fitted(fit)
    mixes = [[n / len(data) for n in estimate.byte_classes(data)] for _, data, _ in fit]
    low = [min(m[c] for m in mixes) for c in range(estimate.CLASSES)]
    high = [max(m[c] for m in mixes) for c in range(estimate.CLASSES)]
    print(f"fitted on {len(fit)} messages; proxy/core/estimate.py:")
    print(f"INTERCEPT = {coefficients[0]:.4f}")
    print(f"COEFFICIENTS = ({', '.join(f'{c:.4f}' for c in coefficients[1:])})")
    print(
        "MIX = ("
        + ", ".join(f"({lo:.3f}, {hi:.3f})" for lo, hi in zip(low, high, strict=True))
        + ")"
    )
    print("\nthe constants in proxy/core/estimate.py, on what they were not fitted on:")
    print("| held out | messages | not estimated | bias | error p50 / p99 / worst |")
    print("|---|---:|---:|---:|---:|")
    groups: dict[str, list[Sample]] = {}
    for sample in [*held, *_session_samples(counter)]:
        groups.setdefault(sample[0], []).append(sample)
    for kind, samples in groups.items():
        errors = []
        for _, data, count in samples:
            guess = estimate.estimate_tokens(data)
            if guess is not None:
                errors.append((guess - count) / count)
        spread = sorted(abs(e) for e in errors)
        print(
            f"| {kind} | {len(samples)} | {len(samples) - len(errors)} "
            f"| {100 * statistics.mean(errors):+.1f}% | {100 * pct(spread, 0.5):.1f}% / "
            f"{100 * pct(spread, 0.99):.1f}% / {100 * spread[-1]:.1f}% |"
        )
    print("\nodd inputs (as a tool result) the guard sends to the exact count:")
    for name, text in _odd_inputs().items():
        result = {"type": "tool_result", "tool_use_id": "toolu_odd", "content": text}
        data = canonical({"role": "user", "content": [result]}).json
        print(f"- {name}: {'exact' if estimate.estimate_tokens(data) is None else 'ESTIMATED'}")
    data = max((d for _, d, _ in held), key=len)
    began = time.perf_counter()
    for _ in range(200):
        estimate.estimate_tokens(data)
    cost = (time.perf_counter() - began) / 200
    text = data.decode()
    began = time.perf_counter()
    counter.count_text(text)
    exact = time.perf_counter() - began
    print(f"\n{len(data):,} bytes: estimate {cost * 1e6:.0f} µs, tiktoken {exact * 1e6:.0f} µs")


if __name__ == "__main__":
    if "--fit" in sys.argv:
        fit_estimate()
    else:
        main()
