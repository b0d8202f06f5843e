"""The replay report: one self-contained HTML page with inline SVG charts."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core.pricing import CACHE_MODEL
from proxy.ops.replay import Replay, money, summary_lines

DIRECT = "#c0392b"
PROXY = "#1f6fb2"
GUIDE = "#7f8c8d"


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    color: str
    values: Sequence[float | None]  # None: no point (the line breaks there)
    crosses: Sequence[int] = ()  # indices of points marked with an x (refused requests)


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks if span > 0 else 1.0
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if raw <= m * magnitude:
            return m * magnitude
    return 10 * magnitude


def _fmt(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    guides: Sequence[tuple[str, float]] = (),
    marks: Sequence[int] = (),
    y_label: str = "",
    width: int = 920,
    height: int = 330,
) -> str:
    """An SVG line chart over turns 1..n; `guides` are labelled horizontal lines and
    `marks` the turns to flag (compactions)."""
    left, right, top, bottom = 70, 20, 36, 44
    n = max(len(s.values) for s in series)
    points = [v for s in series for v in s.values if v is not None]
    top_value = max(points + [g[1] for g in guides if g[1] <= 1.5 * max(points, default=0)])
    top_value = top_value or 1.0
    step = _nice_step(top_value)
    y_max = step * math.ceil(top_value / step)
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(i: int) -> float:
        return left + (plot_w * (i / (n - 1)) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="20" font-size="15" font-weight="bold">{html.escape(title)}</text>',
    ]
    tick = 0.0
    while tick <= y_max + 1e-9:
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"'
            ' stroke="#e5e5e5"/>'
            f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" font-size="11" text-anchor="end">'
            f"{_fmt(tick)}</text>"
        )
        tick += step
    every = max(1, math.ceil(n / 12))
    for i in range(0, n, every):
        out.append(
            f'<text x="{x(i):.1f}" y="{height - bottom + 16}" font-size="11"'
            f' text-anchor="middle">{i + 1}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2}" y="{height - 8}" font-size="12"'
        ' text-anchor="middle">turn</text>'
    )
    if y_label:
        out.append(
            f'<text x="14" y="{top + plot_h / 2}" font-size="12" text-anchor="middle"'
            f' transform="rotate(-90 14 {top + plot_h / 2})">{html.escape(y_label)}</text>'
        )
    for i in marks:
        out.append(
            f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{top}" y2="{top + plot_h}"'
            f' stroke="{PROXY}" stroke-opacity="0.25" stroke-dasharray="2 3"/>'
        )
    label_y = float("-inf")
    for label, value in sorted(guides, key=lambda g: -g[1]):  # top line first
        if value <= y_max:
            # A line close under the last labelled one (a target just under its
            # trigger) gets its label below it, not across the other.
            above, below = y(value) - 4, y(value) + 12
            label_y = above if above >= label_y + 12 else max(below, label_y + 12)
            out.append(
                f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}"'
                f' y2="{y(value):.1f}" stroke="{GUIDE}" stroke-dasharray="6 4"/>'
                f'<text x="{width - right - 4}" y="{label_y:.1f}" font-size="11"'
                f' text-anchor="end" fill="{GUIDE}">{html.escape(label)} {_fmt(value)}</text>'
            )
    out.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>'
    )
    lx = left + 10
    for s in series:
        for run in _runs(s.values):
            line = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            out.append(
                f'<polyline points="{line}" fill="none" stroke="{s.color}" stroke-width="2"/>'
            )
        for i in s.crosses:
            point = s.values[i]
            if point is not None:
                cx, cy = x(i), y(point)
                out.append(
                    f'<path d="M{cx - 4:.1f},{cy - 4:.1f}L{cx + 4:.1f},{cy + 4:.1f}'
                    f'M{cx - 4:.1f},{cy + 4:.1f}L{cx + 4:.1f},{cy - 4:.1f}"'
                    f' stroke="{s.color}" stroke-width="2"/>'
                )
        out.append(
            f'<rect x="{lx}" y="{top + 8}" width="14" height="4" fill="{s.color}"/>'
            f'<text x="{lx + 20}" y="{top + 14}" font-size="12">{html.escape(s.label)}</text>'
        )
        lx += 40 + 7 * len(s.label)  # about 7 px a character at this size
    out.append("</svg>")
    return "\n".join(out)


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """The stretches of consecutive points that have a value."""
    runs: list[list[tuple[int, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            runs.append([])
        else:
            runs[-1].append((i, v))
    return [r for r in runs if r]


def _cumulative(values: Sequence[float | None]) -> list[float | None]:
    """Running totals; None from the first missing value on (nothing after it happens)."""
    total = 0.0
    out: list[float | None] = []
    for v in values:
        if v is None or (out and out[-1] is None):
            out.append(None)
            continue
        total += v
        out.append(total)
    return out


def _unit_label(result: Replay) -> str:
    if result.unit == CACHE_MODEL.unit:
        return "cost (units: 1 = an uncached input token)"
    return f"cost ({result.unit})"


def render_report(result: Replay, source: str) -> str:
    turns = result.turns
    p = result.policy
    marks = [t.n - 1 for t in result.crossings]
    refused = [t.n - 1 for t in turns if t.direct_refused]
    without = f"without the proxy{' (x: refused, over the window)' if refused else ''}"
    guides = []
    if p is not None:
        guides = [("window", float(p.window)), ("trigger (history)", float(p.trigger_tokens)),
                  ("target (history)", float(p.target_tokens))]  # fmt: skip
    context = line_chart(
        "Context sent per turn (tokens)",
        [
            Series(without, DIRECT, [t.direct_tokens for t in turns], refused),
            Series("with the proxy", PROXY, [t.proxy_tokens for t in turns]),
        ],
        guides=guides,
        marks=marks,
        y_label="tokens",
    )
    direct_costs = [None if t.direct_refused else t.direct_cost for t in turns]
    unit = _unit_label(result)
    without = f"without the proxy{' (ends where the API refuses)' if refused else ''}"
    cost = line_chart(
        f"Billed cost per turn ({result.unit})",
        [
            Series(without, DIRECT, direct_costs),
            Series("with the proxy", PROXY, [t.proxy_cost for t in turns]),
        ],
        marks=marks,
        y_label=unit,
    )
    cumulative = line_chart(
        f"Billed cost, cumulative ({result.unit})",
        [
            Series(without, DIRECT, _cumulative(direct_costs)),
            Series("with the proxy", PROXY, _cumulative([t.proxy_cost for t in turns])),
        ],
        marks=marks,
        y_label=unit,
    )
    rows = "\n".join(
        f"<tr><td>{t.n}</td><td>{t.direct_tokens:,}</td><td>{t.proxy_tokens:,}</td>"
        f"<td>{html.escape(t.strategy_word or '-')}{' + summary' if t.summary_made else ''}</td>"
        f"<td>{t.proxied.cache_read_input_tokens:,}</td>"
        f"<td>{t.proxied.cache_creation_input_tokens:,}</td>"
        + (
            "<td>refused (over the window)</td>"
            if t.direct_refused
            else f"<td>{html.escape(money(t.direct_cost, result.unit))}</td>"
        )
        + f"<td>{html.escape(money(t.proxy_cost, result.unit))}</td></tr>"
        for t in turns
    )
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(result))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>compaction-proxy replay: {html.escape(source)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 960px; }}
h1 {{ font-size: 20px; }} li {{ margin: 2px 0; }}
table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border: 1px solid #ddd; padding: 2px 8px; text-align: right; }}
th {{ background: #f4f4f4; }} svg {{ display: block; margin: 18px 0; }}
.note {{ color: #555; font-size: 13px; }}
</style></head><body>
<h1>Replay of {html.escape(source)}</h1>
<ul>{summary}</ul>
<p class="note">Prices: {html.escape(result.price_note)}. Both runs are counted with the
stand-in's prompt-cache model. Without the proxy, a request over the model's window is
refused by the API (marked x, billed nothing). Dotted vertical lines: turns where the
proxy made a new rewrite (a crossing of the trigger). A summary the proxy makes is billed
as one extra call (prompt uncached, output at its cap). read_result rounds are not
simulated.</p>
{context}
{cost}
{cumulative}
<table><tr><th>turn</th><th>tokens sent without</th><th>tokens sent with</th>
<th>proxy</th><th>cache read with (tokens)</th><th>cache write with (tokens)</th>
<th>cost without ({html.escape(result.unit)})</th>
<th>cost with ({html.escape(result.unit)})</th></tr>
{rows}
</table>
</body></html>
"""
