"""Context policy: per-model numbers that decide when and how a history is rewritten.

All sizes are in tokens of the message history (system prompt and tools excluded). Two
thresholds: from `offload_trigger` on, every large tool result that has left the keep
window is offloaded as soon as it has (a stub in its place, the stubbed region only ever
growing at its end); when the history crosses `trigger`, the oldest turns are folded into
a summary (or dropped) down to `target`, as in seed 000, so folds are many turns apart
(the hysteresis that keeps the upstream prompt cache warm). The window bounds the whole
request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from difflib import get_close_matches
from fnmatch import fnmatchcase
from typing import Any

# The defaults' shares of the window, chosen by bench/sweep.py over the long-tool and
# chat-heavy traces (bench/RESULTS.md, "Policy defaults by measurement"): folding earlier
# and often costs less than folding late and deep (each fold keeps the newest keep_last
# groups and a summary, whatever the target), and offloading from 10% of the window
# costs less than from 15%.
TRIGGER_SHARE, TARGET_SHARE, OFFLOAD_SHARE = 0.5, 0.4, 0.1


class PolicyError(ValueError):
    """A policy setting is wrong; the message names it."""


@dataclass(frozen=True, slots=True)
class Policy:
    match: str = "*"  # glob on the request's `model`
    window: int = 200_000  # the model's context window, whole request
    trigger: int = 0  # history size that starts a fold; 0 = 50% of the window
    target: int = 0  # history size after a fold; 0 = 40% of the window
    offload_trigger: int = 0  # history size from which results are offloaded; 0 = 10% of the window
    keep_last: int = 6  # newest groups that stay verbatim when folding
    note_cost: int = 48  # tokens reserved for a "history was dropped" note
    offload_threshold: int = 500  # tool results above this many tokens may be offloaded
    keep_results: int = 1  # the newest tool results are never offloaded
    stub_head_chars: int = 200  # how much of an offloaded result stays in the stub
    read_length: int = 8_000  # default slice length read_result suggests
    summariser_model: str = ""  # empty = the request's own model
    summary_max_tokens: int = 8_000  # cap on the summary, below the slot
    max_read_rounds: int = 4  # read_result round trips per client request

    @property
    def trigger_tokens(self) -> int:
        return self.trigger or int(self.window * TRIGGER_SHARE)

    @property
    def target_tokens(self) -> int:
        return self.target or int(self.window * TARGET_SHARE)

    @property
    def offload_tokens(self) -> int:
        return self.offload_trigger or min(int(self.window * OFFLOAD_SHARE), self.trigger_tokens)

    @property
    def prepare_tokens(self) -> int:
        """From here on, the next fold's summary is made ahead, in the background."""
        return prepare_at(self.trigger_tokens, self.target_tokens)

    @property
    def quiet_tokens(self) -> int:
        """Up to here there is nothing to plan: no offload, no summary made ahead."""
        return min(self.offload_tokens, self.prepare_tokens)

    def validate(self) -> Policy:
        where = f"policy {self.match!r}"
        positive = ("window", "note_cost", "offload_threshold", "stub_head_chars", "read_length")
        for name in positive:
            if getattr(self, name) <= 0:
                raise PolicyError(f"{where}: {name} must be a positive number of tokens")
        names = ("trigger", "target", "offload_trigger", "keep_last", "keep_results")
        for name in (*names, "max_read_rounds"):
            if getattr(self, name) < 0:
                raise PolicyError(f"{where}: {name} must not be negative")
        if self.summary_max_tokens <= 0:
            raise PolicyError(f"{where}: summary_max_tokens must be positive")
        if self.trigger_tokens > self.window:
            raise PolicyError(f"{where}: trigger ({self.trigger_tokens}) exceeds the window")
        if self.target_tokens >= self.trigger_tokens:
            raise PolicyError(
                f"{where}: target ({self.target_tokens}) must be below trigger"
                f" ({self.trigger_tokens}), or every request would compact"
            )
        if self.offload_tokens > self.trigger_tokens:
            raise PolicyError(
                f"{where}: offload_trigger ({self.offload_tokens}) must not be above trigger"
                f" ({self.trigger_tokens})"
            )
        return self


def prepare_at(trigger: int, target: int) -> int:
    """Four fifths of the way from the target to the trigger: a summary made from here
    has the turns until the trigger to be ready."""
    return target + (trigger - target) * 4 // 5


FIELD_TYPES = {f.name: f.type for f in fields(Policy)}


def parse_policies(raw: Sequence[Mapping[str, Any]]) -> list[Policy]:
    """Policies from config tables, in order; the first whose `match` fits a model wins."""
    out = []
    for n, table in enumerate(raw):
        if not isinstance(table, Mapping):
            raise PolicyError(f"policy #{n + 1} must be a table")
        where = f"policy #{n + 1}" + (f" ({table['match']!r})" if "match" in table else "")
        unknown = sorted(set(table) - set(FIELD_TYPES))
        if unknown:
            named = ", ".join(_with_hint(name) for name in unknown)
            raise PolicyError(
                f"{where}: unknown field(s) {named}; valid fields: {', '.join(FIELD_TYPES)}"
            )
        for key, value in table.items():
            want = str if FIELD_TYPES[key] == "str" else int
            if not isinstance(value, want) or isinstance(value, bool):
                raise PolicyError(f"{where}: {key} must be {want.__name__}, got {value!r}")
        out.append(Policy(**table).validate())
    return out


def _with_hint(name: str) -> str:
    """An unknown field's name, with the field it most likely meant."""
    close = get_close_matches(name, list(FIELD_TYPES), n=1)
    return f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)


def policy_for(
    model: str, policies: Sequence[Policy], override: Mapping[str, Any] | None = None
) -> Policy:
    """The first policy whose glob matches the model (a default when none does).

    `override` (a key's or team's own window/trigger/target) replaces fields of it.
    """
    chosen = next((p for p in policies if fnmatchcase(model, p.match)), Policy())
    if override:
        chosen = replace(chosen, **override).validate()
    return chosen


DEFAULT_POLICIES = [
    # Today's Claude models: a 200k window by default (1M only with a beta header).
    Policy(match="claude-*", window=200_000, trigger=100_000, target=80_000),
    # OpenAI-format models served through the Chat adapter (the same shares of the window).
    Policy(match="gpt-*", window=128_000, trigger=64_000, target=51_200),
    Policy(match="*"),
]
