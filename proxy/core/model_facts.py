"""Model facts: each model's window (max input tokens), max output and prices, from the
vendored snapshot of the maintained tables (proxy/core/model_snapshot.py, made by
`compaction-proxy models refresh`), never typed into the code.

A model is looked up as requests name it (a Bedrock or Vertex id by its Anthropic name,
proxy/core/model_names.py): exactly, then without a provider prefix (`anthropic/`,
`openai/`, `gemini/`, the Gemini API's `models/`), a date suffix (`-20250929`,
`-2025-08-07`) or `-latest`. Some Claude models reach 1,000,000 input tokens only with an
`anthropic-beta: context-1m-...` header: with it their beta window applies. A model the
table does not know gets a stated conservative default (UNKNOWN_WINDOWS: the smallest
window of its family). `[[policy]]` `window` and `[[price]]` tables override all of this.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from proxy.core import model_snapshot
from proxy.core.model_names import anthropic_name

# The window of a model the table does not know: every Claude model has at least 200,000
# input tokens, and every Gemini text model (flash, flash-lite, pro) at least 1,000,000;
# for any other, OpenAI's smallest current chat window.
UNKNOWN_WINDOWS = (("claude*", 200_000), ("gemini-*", 1_000_000), ("*", 128_000))
BETA_PREFIX = "context-1m-"
UNKNOWN_SOURCE = "default for a model not in the model table"
# A provider's prefix (LiteLLM's), or the Gemini API's resource name (`models/gemini-...`).
_PREFIX = re.compile(r"^(anthropic|openai|gemini|models)/")
_DATE = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")

Price = tuple[float | None, float | None, float | None, float | None, float | None]


@dataclass(frozen=True, slots=True)
class ModelFacts:
    name: str  # the table's name for it
    max_input: int
    max_output: int
    beta_input: int  # max input with the context-1m beta (0: no such beta)
    price: Price | None  # USD per million: input, output, cache read, write 5m, write 1h


@dataclass(frozen=True, slots=True)
class Window:
    """The window that applies to a request, and where it came from (for messages)."""

    tokens: int
    source: str


@dataclass(frozen=True, slots=True)
class ModelTable:
    models: Mapping[str, tuple[int, int, int, float | None, float | None, float | None,
                               float | None, float | None]]  # fmt: skip
    source: str
    made: str

    def lookup(self, model: str) -> ModelFacts | None:
        for name in candidates(model):
            row = self.models.get(name)
            if row is not None:
                price = None if row[3] is None or row[4] is None else row[3:8]
                return ModelFacts(name, row[0], row[1], row[2], price)
        return None

    @property
    def described(self) -> str:
        return f"{self.source}, made {self.made}, {len(self.models)} models"


def candidates(model: str) -> list[str]:
    """The names a model may be listed under, the most specific first."""
    name = _PREFIX.sub("", anthropic_name(model).strip().lower())
    out = [name]
    for stripped in (_DATE.sub("", name), name.removesuffix("-latest")):
        if stripped not in out:
            out.append(stripped)
    return out


def default_window(model: str) -> int:
    name = anthropic_name(model).lower()
    return next(tokens for glob, tokens in UNKNOWN_WINDOWS if fnmatchcase(name, glob))


def wants_1m(betas: str) -> bool:
    """Whether an `anthropic-beta` header value (a comma list) asks for the 1M window."""
    return any(b.strip().lower().startswith(BETA_PREFIX) for b in betas.split(","))


def window_for(model: str, betas: str = "", table: ModelTable | None = None) -> Window:
    """The model's window from the table (its beta window when the header asks for it),
    or the stated default for a model the table does not know."""
    found = (table or BUILTIN).lookup(model)
    if found is None:
        return Window(default_window(model), UNKNOWN_SOURCE)
    if found.beta_input and wants_1m(betas):
        return Window(found.beta_input, f"model table ({found.name}, with the context-1m beta)")
    return Window(found.max_input, f"model table ({found.name})")


# The models Anthropic's tool search docs list as taking deferred tools (`defer_loading`,
# `tool_reference`) on the Claude API, Bedrock and Vertex, without a beta (the docs'
# curl example sends none): read_result may join their requests deferred even where the
# client did not turn tool search on (proxy/core/driver.py). Names as `candidates` gives
# them (a date suffix stripped); a model not here is deferred only where the client
# turns tool search on itself. Kept by hand: the maintained tables do not say it.
TOOL_SEARCH_MODELS = frozenset(
    {
        "claude-opus-5-5",
        "claude-opus-5",
        "claude-sonnet-5-5",
        "claude-sonnet-5",
        "claude-haiku-5-5",
        "claude-haiku-4-5",
        "claude-opus-4-5",
        "claude-opus-4-6",
        "claude-opus-4-7",
        "claude-opus-4-8",
        "claude-sonnet-4-5",
        "claude-sonnet-4-6",
        "claude-fable-5",
        "claude-fable-5-1",
        "claude-mythos-5",
        "claude-mythos-5-1",
        "claude-mythos-preview",
    }
)


def takes_tool_search(model: str) -> bool:
    """Whether the model is one tool search is documented for (TOOL_SEARCH_MODELS), by
    any name a request gives it (a Bedrock or Vertex id, a dated snapshot)."""
    return any(name in TOOL_SEARCH_MODELS for name in candidates(model))


def max_output(model: str, table: ModelTable | None = None) -> int:
    """The model's max output tokens from the table (0: not known)."""
    found = (table or BUILTIN).lookup(model)
    return found.max_output if found is not None else 0


BUILTIN = ModelTable(
    model_snapshot.ROWS, f"{model_snapshot.SOURCE}; {model_snapshot.SECOND}", model_snapshot.MADE
)
