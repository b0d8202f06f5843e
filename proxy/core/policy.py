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
from dataclasses import dataclass, field, fields, replace
from difflib import get_close_matches
from typing import Any

from proxy.core.model_facts import ModelTable, window_for
from proxy.core.model_names import model_matches

# The fold trigger and target are economic and fidelity choices in tokens of history,
# chosen by bench/sweep.py over the long-tool and chat-heavy traces (bench/RESULTS.md,
# "Policy defaults by measurement"), not shares of whatever window a model has: a turn
# past the trigger is paid at the larger size, and a summary keeps what it keeps whatever
# the window. Each is capped by the window (its share below), for small windows. The
# offload trigger, stub head and keep window by bench/optimal.py's floor and `replay` on
# recorded Claude Code sessions (bench/RESULTS.md, issue 35): from 12,000 rather than
# 20,000, results are stubbed as they age instead of two or three at once (0.526x ->
# 0.509x there); 12,000 still proves a Claude Code first turn (10.6 KB of messages) quiet
# by its byte bound (tests/core/test_quiet_counting.py), 10,000 (0.508x) would not.
DEFAULT_TRIGGER, DEFAULT_TARGET, DEFAULT_OFFLOAD = 60_000, 30_000, 12_000
TRIGGER_SHARE, TARGET_SHARE, OFFLOAD_SHARE = 0.5, 0.4, 0.1
# Aged results stubbed together under the trigger where the API caches repeated prefixes by
# itself and the proxy places no breakpoint (OpenAI's formats, Gemini): the history as sent
# stays the same between batches, one cache miss a batch (Codex's WebSocket: 11 of 18 frames
# incremental at 4, 2 at 1; bench/RESULTS.md, issue 35).
PREFIX_CACHED_BATCH = 4
# A policy's thresholds in tokens, made from its settings (Policy.__post_init__).
THRESHOLDS = ("trigger_tokens", "target_tokens", "offload_tokens", "prepare_tokens", "quiet_tokens")
# Fields of a policy that are not settings: where its numbers came from, not what they
# are, and what its settings make.
NOT_SETTINGS = frozenset({"window_source", *THRESHOLDS})


class PolicyError(ValueError):
    """A policy setting is wrong; the message names it."""


@dataclass(frozen=True, slots=True)
class Policy:
    match: str = "*"  # glob on the request's `model`
    # The model's context window (max input tokens), whole request; 0 (a [[policy]] that
    # sets none): the model table's (proxy/core/model_facts.py), resolved by policy_for.
    window: int = 200_000
    trigger: int = 0  # history size that starts a fold; 0 = DEFAULT_TRIGGER, capped by the window
    target: int = 0  # history size after a fold; 0 = DEFAULT_TARGET, capped by the window
    offload_trigger: int = 0  # history size from which results are offloaded; 0 = DEFAULT_OFFLOAD
    keep_last: int = 4  # newest groups that stay verbatim when folding (bench/RESULTS.md)
    note_cost: int = 48  # tokens reserved for a "history was dropped" note
    offload_threshold: int = 500  # tool results above this many tokens may be offloaded
    keep_results: int = 1  # the newest tool results are never offloaded
    # ... as many of them as fit in this many tokens (0: no bound; the newest always stays):
    # a result kept whole past its turn is written again when it is stubbed (issue 35)
    keep_results_tokens: int = 8_000
    # Aged results stubbed together under the trigger (1: as each ages); 0: the format's
    # (its Dialect's offload_batch: 1 on Messages, PREFIX_CACHED_BATCH where the API caches
    # prefixes by itself).
    offload_batch: int = 0
    stub_head_chars: int = 100  # how much of an offloaded result stays in the stub
    read_length: int = 8_000  # default slice length read_result suggests
    summariser_model: str = ""  # empty = the request's own model
    summary_max_tokens: int = (
        4_000  # cap on the summary; a fold's room may lower it (bench/facts.py)
    )
    max_read_rounds: int = 4  # read_result round trips per client request
    # Where `window` came from (this policy, the model table, a default): for messages.
    window_source: str = field(default="", compare=False)
    # The thresholds in tokens the settings above make (0s and shares of the window
    # resolved), made once with the policy (a request's is memoised per model), so what
    # reads them reads fields: the fold trigger and target,
    trigger_tokens: int = field(init=False, compare=False, repr=False)
    target_tokens: int = field(init=False, compare=False, repr=False)
    # the offload trigger (never above the fold trigger),
    offload_tokens: int = field(init=False, compare=False, repr=False)
    # from here on, the next fold's summary is made ahead, in the background,
    prepare_tokens: int = field(init=False, compare=False, repr=False)
    # and up to here there is nothing to plan: no offload, no summary made ahead.
    quiet_tokens: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        trigger = self.trigger or _capped(DEFAULT_TRIGGER, self.window, TRIGGER_SHARE)
        target = self.target or _capped(DEFAULT_TARGET, self.window, TARGET_SHARE)
        default = _capped(DEFAULT_OFFLOAD, self.window, OFFLOAD_SHARE)
        offload = self.offload_trigger or min(default, trigger)
        prepare = prepare_at(trigger, target)
        made = trigger, target, offload, prepare, min(offload, prepare)
        for name, value in zip(THRESHOLDS, made, strict=True):
            object.__setattr__(self, name, value)

    def validate(self) -> Policy:
        where = f"policy {self.match!r}"
        positive = ("note_cost", "offload_threshold", "stub_head_chars", "read_length")
        for name in positive:
            if getattr(self, name) <= 0:
                raise PolicyError(f"{where}: {name} must be a positive number of tokens")
        names = ("window", "trigger", "target", "offload_trigger", "keep_last", "keep_results",
                 "keep_results_tokens")  # fmt: skip
        for name in (*names, "max_read_rounds"):
            if getattr(self, name) < 0:
                raise PolicyError(f"{where}: {name} must not be negative")
        if self.offload_batch < 0:
            raise PolicyError(f"{where}: offload_batch must not be negative (0: the format's)")
        if self.summary_max_tokens <= 0:
            raise PolicyError(f"{where}: summary_max_tokens must be positive")
        if self.window and self.trigger_tokens > self.window:
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


def _capped(tokens: int, window: int, share: float) -> int:
    """A default amount of tokens, capped at its share of the window (once known)."""
    return min(tokens, int(window * share)) if window else tokens


def prepare_at(trigger: int, target: int) -> int:
    """Four fifths of the way from the target to the trigger: a summary made from here
    has the turns until the trigger to be ready."""
    return target + (trigger - target) * 4 // 5


FIELD_TYPES = {f.name: f.type for f in fields(Policy) if f.name not in NOT_SETTINGS}


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
        # A policy that names no window takes the model's from the model table.
        out.append(Policy(**{"window": 0, **table}).validate())
    return out


def _with_hint(name: str) -> str:
    """An unknown field's name, with the field it most likely meant."""
    close = get_close_matches(name, list(FIELD_TYPES), n=1)
    return f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)


def policy_for(
    model: str,
    policies: Sequence[Policy],
    override: Mapping[str, Any] | None = None,
    *,
    betas: str = "",
    table: ModelTable | None = None,
) -> Policy:
    """The first policy whose glob matches the model (a default when none does), with
    the window it applies: its own, or the model table's for the model (its 1M window
    when `betas`, the request's `anthropic-beta`, asks for it).

    `override` (a key's or team's own window/trigger/target) replaces fields of it.
    """
    chosen = next((p for p in policies if model_matches(model, p.match)), DEFAULT_POLICIES[-1])
    if override:
        chosen = replace(chosen, **override)
    if chosen.window:
        source = chosen.window_source or f"policy {chosen.match!r}"
        return replace(chosen, window_source=source).validate()
    window = window_for(model, betas, table)
    resolved = replace(chosen, window=window.tokens, window_source=window.source)
    try:
        return resolved.validate()
    except PolicyError:
        # Its own trigger, target or offload point do not fit the model's window: the
        # defaults (capped by that window) do.
        fitted = replace(resolved, trigger=0, target=0, offload_trigger=0)
        note = f"{window.source}; the policy's thresholds exceed it: the defaults apply"
        return replace(fitted, window_source=note).validate()


DEFAULT_POLICIES = [
    # Every model: its window from the model table (a stated default for one it lacks),
    # the fold trigger and target in tokens (DEFAULT_TRIGGER, DEFAULT_TARGET).
    Policy(match="*", window=0),
]
