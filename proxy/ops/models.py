"""`compaction-proxy models`: the vendored model table, shown and refreshed.

The table the proxy reads its windows, output limits and prices from
(proxy/core/model_snapshot.py) is made from two maintained tables, never typed by hand:

- LiteLLM's `model_prices_and_context_window.json` (shipped in the `litellm` wheel as
  `litellm/model_prices_and_context_window_backup.json`): `max_input_tokens`,
  `max_output_tokens` and the per-token prices of each Anthropic, OpenAI and Gemini API
  chat or responses model (LiteLLM lists the Gemini API's as `gemini/<model>`: they are
  kept under the name requests give them);
- pydantic's `genai-prices` (a dependency): a second opinion on each window (where it lists
  a smaller one, the smaller is taken: a window too large gets requests refused) and the
  models whose price has a tier from 200,000 input tokens, i.e. that reach 1,000,000 with
  the `context-1m` beta, as do the LiteLLM entries priced `..._above_200k_tokens`.

`models refresh` rewrites the snapshot from an installed `litellm` or a given JSON file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from proxy.console import fail

SNAPSHOT = Path(__file__).parents[1] / "core" / "model_snapshot.py"
# The providers kept, by LiteLLM's name for them and by genai-prices'. Google's (the
# Gemini API's models; genai-prices lists Claude on Vertex there too) gives Gemini only.
PROVIDERS = ("anthropic", "openai", "gemini")
SECOND_PROVIDERS = ("anthropic", "openai", "google")
GEMINI_PREFIX = "gemini/"
MODES = ("chat", "responses")
ONE_MILLION = 1_000_000
BETA_WINDOW = 1_000_000  # what `context-1m` gives


def add_commands(commands: Any) -> None:
    models = commands.add_parser(
        "models",
        help="the model table: windows, output limits and prices per model",
        description="Show what the vendored model table says of a model, or refresh the"
        " table from LiteLLM's model_prices_and_context_window.json and genai-prices.",
    )
    sub = models.add_subparsers(dest="models_command", required=True)
    show = sub.add_parser("show", help="what the table says of models (default: all)")
    show.add_argument("model", nargs="*", help="model names as requests send them")
    show.set_defaults(ops_run=run_show)
    refresh = sub.add_parser(
        "refresh",
        help="regenerate proxy/core/model_snapshot.py",
        description="Regenerate the snapshot from LiteLLM's JSON (the installed litellm"
        " package's copy, or --from FILE) and the installed genai-prices.",
    )
    refresh.add_argument(
        "--from", dest="source", type=Path, help="model_prices_and_context_window.json"
    )
    refresh.add_argument(
        "--label", help="what the --from file is, for the snapshot's SOURCE (e.g. litellm 1.110.2)"
    )
    refresh.add_argument("--out", type=Path, default=SNAPSHOT, help="the module to write")
    refresh.set_defaults(ops_run=run_refresh)


def run_show(args: argparse.Namespace) -> int:
    from proxy.core import model_facts  # (refresh runs without a snapshot to read)

    table = model_facts.BUILTIN
    print(f"model table: {table.source}")
    names = args.model or sorted(table.models)
    for name in names:
        facts = table.lookup(name)
        if facts is None:
            default = model_facts.default_window(name)
            print(f"{name}: not in the table (a default window of {default:,} applies)")
            continue
        beta = f", {facts.beta_input:,} with context-1m" if facts.beta_input else ""
        price = ""
        if facts.price is not None:
            p = facts.price
            price = f"; USD/MTok input {p[0]:g}, output {p[1]:g}"
        limits = f"max input {facts.max_input:,}{beta}, max output {facts.max_output:,}"
        print(f"{name}: {limits}{price}")
    return 0


def run_refresh(args: argparse.Namespace) -> int:
    if args.source is not None:
        path: Path = args.source
        version = args.label or f"file {path.name}"
    else:
        try:
            dist = metadata.distribution("litellm")
        except metadata.PackageNotFoundError:
            return fail("models refresh: litellm is not installed; give --from FILE")
        found = dist.locate_file("litellm/model_prices_and_context_window_backup.json")
        path = Path(str(found))
        version = f"litellm {dist.version}"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return fail(f"models refresh: cannot read {path}: {e}")
    second = genai_windows()
    made = datetime.datetime.now(datetime.UTC).date().isoformat()
    rows = build(raw, second)
    source = f"LiteLLM's model_prices_and_context_window.json ({version})"
    args.out.write_text(render(rows, source, genai_version(), made))
    print(f"wrote {len(rows)} models to {args.out} ({source}, {made})")
    return 0


Row = tuple[int, int, int, float | None, float | None, float | None, float | None, float | None]


def build(raw: Mapping[str, Any], second: Mapping[str, tuple[int | None, bool]]) -> dict[str, Row]:
    """The snapshot's rows from LiteLLM's table and genai-prices' (window, 1M tier) per
    model: (max input, max output, max input with context-1m or 0, then USD per million
    tokens: input, output, cache read, 5-minute cache write, 1-hour cache write)."""
    beta_priced = [
        k for k, v in raw.items() if "claude" in k and isinstance(v, dict) and _above_200k(v)
    ]
    rows: dict[str, Row] = {}
    for key, entry in sorted(raw.items()):
        name = key.removeprefix(GEMINI_PREFIX)
        if not isinstance(entry, dict) or "/" in name or ":" in name:
            continue
        if entry.get("litellm_provider") not in PROVIDERS or entry.get("mode") not in MODES:
            continue
        max_input = entry.get("max_input_tokens")
        max_output = entry.get("max_output_tokens") or 0
        if not isinstance(max_input, int) or max_input <= 0:
            continue
        other, tiered = second.get(name, (None, False))
        if other is not None and other < max_input:
            max_input = other  # the tables disagree: the smaller window is the safe one
        if name in rows and rows[name][0] < max_input:
            continue  # listed twice (Gemini's, with and without its prefix): the same
        beta = 0
        claude = name.startswith("claude")
        if claude and max_input < BETA_WINDOW and (tiered or _named_in(name, beta_priced)):
            beta = BETA_WINDOW
        rows[name] = (
            max_input,
            int(max_output),
            beta,
            _per_million(entry.get("input_cost_per_token")),
            _per_million(entry.get("output_cost_per_token")),
            _per_million(entry.get("cache_read_input_token_cost")),
            _per_million(entry.get("cache_creation_input_token_cost")),
            _per_million(entry.get("cache_creation_input_token_cost_above_1hr")),
        )
    return rows


def _above_200k(entry: Mapping[str, Any]) -> bool:
    """Priced past 200,000 input tokens (under any provider's name for the model)."""
    return any("above_200k" in key for key in entry)


def _named_in(name: str, keys: Iterable[str]) -> bool:
    """Whether any key is this model under another provider's name (dated, versioned)."""
    pattern = re.compile(rf"(^|[./]){re.escape(name)}(-\d{{8}})?(-v\d|@|$)")
    return any(pattern.search(k) for k in keys)


def _per_million(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return round(float(value) * ONE_MILLION, 6)


def genai_windows() -> dict[str, tuple[int | None, bool]]:
    """genai-prices' context window of each Anthropic, OpenAI and Gemini model, and whether its
    price has a tier from 200,000 input tokens (a 200k Claude model then reaches 1M with
    the beta). For OpenAI models it is the whole window (input and output): only where it is
    below LiteLLM's max input does it change anything."""
    try:
        from genai_prices import data
    except ImportError:
        return {}
    out: dict[str, tuple[int | None, bool]] = {}
    for provider in data.providers:
        if provider.id not in SECOND_PROVIDERS:
            continue
        for model in provider.models:
            if provider.id == "google" and not model.id.startswith("gemini"):
                continue
            prices = model.prices
            chosen = prices[-1].prices if isinstance(prices, list) else prices
            tiers = getattr(chosen.input_mtok, "tiers", None) or []
            tiered = any(getattr(t, "start", 0) == 200_000 for t in tiers)
            out[model.id] = (model.context_window, tiered)
    return out


def genai_version() -> str:
    try:
        return f"genai-prices {metadata.version('genai-prices')}"
    except metadata.PackageNotFoundError:
        return "no genai-prices"


HEADER = '''"""The model table: windows, output limits and prices per model (generated).

Made by `compaction-proxy models refresh` (proxy/ops/models.py) from the maintained tables
named in SOURCE and SECOND; do not edit by hand. Each row: (max input tokens, max output tokens, max
input with the `context-1m` beta or 0, then USD per million tokens: input, output, cache
read, 5-minute cache write, 1-hour cache write; None where the table gives no price).
"""

from __future__ import annotations

'''


def render(rows: Mapping[str, Row], source: str, second: str, made: str) -> str:
    lines = [HEADER, f"SOURCE = {json.dumps(source)}\n", f"SECOND = {json.dumps(second)}\n"]
    lines.append(f"MADE = {json.dumps(made)}\n\n")
    lines.append("Price = float | None\n")
    lines.append("ROWS: dict[str, tuple[int, int, int, Price, Price, Price, Price, Price]] = {\n")
    for name, row in rows.items():
        cells = ", ".join(_cell(v) for v in row)
        lines.append(f"    {json.dumps(name)}: ({cells}),\n")
    lines.append("}\n")
    return "".join(lines)


def _cell(value: int | float | None) -> str:
    if value is None:
        return "None"
    if isinstance(value, int):
        return f"{value:_}"
    return repr(value)
