"""Counting one request, once: what every later step reads.

Before planning, the proxy needs each message's estimated tokens and its match digest
(proxy/core/digests.py). `count_request` makes one pass per message for both: it
serialises the message once (digests.canonical) and looks its count up under an
in-process key of that JSON (tokens.CountKey), so a history whose messages were seen
before costs a dump and a cheap hash per message, and the digests one sha256 each; what
the reuse cache kept for a message parsed before (proxy/core/reuse.py, `seen`) is not
made again at all. A large message not counted before is estimated from its bytes
(proxy/core/estimate.py: about 30x cheaper than tiktoken) and its estimate kept apart:
`Counted.uncertain` says which counts are estimates, and `Counted.exactly` counts them
with tiktoken where the planner says an estimate could decide otherwise (each message is
counted exactly at most once, then kept). `count_tokens` is the same count without the
digests and without estimates, for what reads only the counts (a read round's fit to the
window, a budget's reservation, a summary's size).

`cannot_cross` answers from the body's size alone when even that is enough to know the
history is under the trigger and the window, so most small requests are not counted.
`count_unless_quiet` applies a bound message by message: a message counted before costs
its cached count, a new one its estimate plus the estimate's margin (at most its JSON's
bytes), so a request whose new messages cannot take the history past any threshold is
forwarded without encoding them and without its match digests (they serve checkpoints,
lines and summary keys, which it does not reach).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from proxy.core.digests import FORMS, Canonical, canonical, digest
from proxy.core.estimate import ESTIMATE_MIN_BYTES, estimate_tokens, margin
from proxy.core.policy import Policy
from proxy.core.request_view import FIXED_FIELDS, RequestView, view_of
from proxy.core.reuse import Known, Seen
from proxy.core.tokens import MESSAGE_OVERHEAD, CountKey, TokenCounter
from proxy.core.wire_format import Request, WireFormat

# Estimated tokens a body can hold beyond one per byte (the tools preamble and such).
BYTE_BOUND_SLACK = 1024
# The formats whose counters charge a message at most its JSON's bytes (Messages, Chat:
# tests/core/test_count_bound.py); Responses items (sealed compaction items, encrypted
# reasoning) are not bounded this way.
BOUNDED_FORMATS = ("anthropic", "chat")
# A message at least this large is keyed by its match digest (sha256), not a cheap hash
# of its JSON: its tokens alone are near a default offload_trigger (20,000), so the
# request is rarely quiet and would need the digest anyway (both hashes cost 1.4x this).
DIGEST_KEYED_BYTES = 64 * 1024


def cannot_cross(body: bytes, policy: Policy, factor: float) -> bool:
    """Whether the body's size alone proves it is under the window and every threshold
    of the policy (offload, a summary made ahead, the trigger: Policy.quiet_tokens).

    Every estimated token of text stands for at least one byte of the JSON body, and the
    fixed overheads (per message, per block) are smaller than the JSON around them; only
    the tools preamble needs slack. Images and documents are the exception (a small PDF
    is charged per page, a URL image a flat amount), so a body with a `source` is counted.
    """
    bound = (len(body) + BYTE_BOUND_SLACK) * factor
    if bound > policy.quiet_tokens or bound > policy.window:
        return False  # before the scan: a body this large is counted anyway
    return b'"source"' not in body


def history_quiet(
    wire: Request,
    size: int,
    history_bytes: int,
    messages: int,
    sourced: bool,
    policy: Policy,
    factor: float,
) -> bool:
    """Whether bytes alone prove the request under the window and every threshold, when
    the body's size (`cannot_cross`) does not: the whole request by the body's `size`,
    as there, and the history by its JSON's (`history_bytes`: orjson's writing of the
    messages, list and commas included), each message costing at most its JSON's bytes
    plus MESSAGE_OVERHEAD (tests/core/test_count_bound.py). An agent's system prompt and
    tools (Claude Code's: 31 KB) count against the window alone, so a short history is
    proven quiet without counting anything. `sourced`: the history's JSON holds a
    `source` (an image or document, charged per pixel or page), or the system prompt
    holds anything but text (`text_system`): then it is counted. What it says quiet,
    `count_unless_quiet` says quiet too (every term of its bound is at most this one's).
    Messages and Chat only (BOUNDED_FORMATS)."""
    if sourced or wire.name not in BOUNDED_FORMATS:
        return False
    if (size + BYTE_BOUND_SLACK) * factor > policy.window:
        return False
    return (history_bytes + messages * MESSAGE_OVERHEAD) * factor <= policy.quiet_tokens


def text_system(body: Mapping[str, Any]) -> bool:
    """Whether the body's system prompt (if any) is text alone: a string or text blocks
    (all the Messages API takes there), whose tokens its bytes bound."""
    system = body.get("system")
    if system is None or isinstance(system, str):
        return True
    return isinstance(system, list) and all(
        isinstance(block, dict) and block.get("type") == "text" for block in system
    )


@dataclass(frozen=True, slots=True)
class Counted:
    fixed: int  # system prompt + tools, estimated
    counts: list[int]  # each message, estimated
    digests: list[bytes]  # each message's match digest ([] from count_tokens)
    # cache_control breakpoints in the request: messages, system and tools (the messages'
    # alone from count_tokens)
    breakpoints: int = 0
    # Per message, what its digest is of (digests.Canonical.form: EXACT, STRING_AS_BLOCK,
    # UNMARKED, UNMARKED_STRING), which says whether it can be rebuilt by digest
    # (working.stubbed_message).
    forms: bytes = b""
    # Per message, the tokens of its count that are an estimate (proxy/core/estimate.py:
    # all of it, or 0 when counted exactly); [] when every count is exact.
    uncertain: list[int] = field(default_factory=list)
    keys: list[CountKey] = field(default_factory=list)  # each message's count key
    # How estimated counts are counted exactly (`recounted`, bound to the request's
    # messages and counter), when there are any.
    recount: Callable[[Counted, Sequence[int]], Counted] | None = field(
        default=None, compare=False, repr=False
    )
    # The request's fixed parts and read_result's name and tokens (`request_view`), made
    # in the same pass: the driver reads them here.
    view: RequestView | None = field(default=None, compare=False, repr=False)
    # Made once from the counts above, for what reads them (the driver, the shell):
    history: int = field(init=False, compare=False, repr=False)  # the messages' tokens
    total: int = field(init=False, compare=False, repr=False)  # ... and the fixed ones
    # how far the history's estimated part may be from its exact count
    margin: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        history = sum(self.counts)
        object.__setattr__(self, "history", history)
        object.__setattr__(self, "total", history + self.fixed)
        object.__setattr__(self, "margin", margin(sum(self.uncertain)) if self.uncertain else 0)

    def fits(self, policy: Policy, factor: float, slack: int = 0) -> bool:
        """Under the window and below anything the policy does (offload, a summary made
        ahead, a fold), calibrated: nothing to plan. `slack`: tokens added to the
        history first (a margin; negative: taken away)."""
        history = self.history + slack
        return (history + self.fixed) * factor <= policy.window and (
            history * factor <= policy.quiet_tokens
        )

    @property
    def estimated(self) -> list[int]:
        """The messages whose counts are estimates."""
        return [n for n, tokens in enumerate(self.uncertain) if tokens]

    def exactly(self, indices: Sequence[int]) -> Counted:
        """These counts with the messages at `indices` counted exactly."""
        if self.recount is None:  # (never: estimates come with their recount)
            return replace(self, uncertain=[])
        return self.recount(self, indices)


def count_request(
    wire: WireFormat,
    base: TokenCounter,
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    seen: Seen | None = None,
    tool_search: bool = False,
) -> Counted:
    """The request's counts, digests and view (`tool_search`: tool search is on for it,
    its betas say so: what read_result adds counts its loading)."""
    counted = _count(
        wire, base, body, messages, None, 1.0, seen=seen, estimating=True, tool_search=tool_search
    )
    assert counted is not None  # without a policy there is no bound to stop at
    return counted


def count_tokens(
    wire: WireFormat,
    base: TokenCounter,
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    seen: Seen | None = None,
) -> Counted:
    """`count_request`'s counts (the same keys, the same cache), with no match digests:
    `digests` is empty."""
    counted = _count(wire, base, body, messages, None, 1.0, digested=False, seen=seen)
    assert counted is not None
    return counted


def count_unless_quiet(
    wire: WireFormat,
    base: TokenCounter,
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    policy: Policy,
    factor: float,
    seen: Seen | None = None,
    tool_search: bool = False,
) -> Counted | None:
    """The request's counts, or None when a bound of them, made without encoding any text
    not counted before, proves `Counted.fits` (nothing to plan).

    The bound: a message whose count is cached costs that count; a new one its estimate
    plus the estimate's margin (proxy/core/estimate.py), and at most its JSON's length in
    bytes plus MESSAGE_OVERHEAD, which no count exceeds (every token of text stands for at
    least one byte, and the per-block overheads are no larger than the JSON around them:
    tests/core/test_count_bound.py). A new message with a `source` (an image or document,
    charged per pixel or page) makes no bound: the request is counted. Messages and Chat
    only (BOUNDED_FORMATS)."""
    return _count(
        wire,
        base,
        body,
        messages,
        policy,
        factor,
        seen=seen,
        estimating=True,
        tool_search=tool_search,
    )


def _count(
    wire: WireFormat,
    base: TokenCounter,
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    policy: Policy | None,
    factor: float,
    *,
    digested: bool = True,
    seen: Seen | None = None,
    estimating: bool = False,
    tool_search: bool = False,
) -> Counted | None:
    """One pass per message (what `seen` kept for a message parsed before is reused: its
    JSON is not made again, nor its key or its digest). `estimating`: a message not
    counted before is estimated when it is large (proxy/core/estimate.py), its estimate
    kept apart from exact counts."""
    counter = wire.counter(base)
    domains = [wire.name.encode() + b":" + form for form in _FORMS]
    facts = [_facts(base, seen, message, domains) for message in messages]
    # A large message is planned with its estimate, whatever was counted before: the
    # counts a request is planned with depend on it alone, never on what this process
    # happened to count (the planner has them counted exactly where that could decide).
    found = [_exact(base, known) for known in facts]
    guesses = [
        _guess(base, known, wire, message) if estimating else None
        for known, message in zip(facts, messages, strict=True)
    ]
    view = view_of(wire, counter, body, seen, facts, tool_search)
    fixed = view.fixed_tokens
    if policy is not None and wire.name in BOUNDED_FORMATS:
        # The cached counts alone over a threshold (a crossing): no bound of the new
        # messages can make it fit, so their bytes are not summed for one.
        cached_total = sum(count for count in found if count is not None)
        if Counted(fixed, [cached_total], []).fits(policy, factor):
            bound = _bound(facts, found, guesses)
            if bound is not None and Counted(fixed, [bound], []).fits(policy, factor):
                return None  # quiet: no digest made (but a large message's key)
    counts = []
    uncertain = [0] * len(facts) if any(g is not None for g in guesses) else []
    for n, (known, count, guess, message) in enumerate(
        zip(facts, found, guesses, messages, strict=True)
    ):
        if guess is not None:
            count = uncertain[n] = guess
        elif count is None:
            count = known.exact = base.remember(known.key, counter.count_message(message))
        counts.append(count)
    digests = [_digest(known) for known in facts] if digested else []
    forms = bytes(known.form for known in facts)
    breakpoints = sum(known.breakpoints for known in facts)
    if digested:  # (what plans: the driver places its breakpoint only within four)
        breakpoints += _outside(wire, body, seen)
    keys = [known.key for known in facts] if uncertain else []
    for fact in facts:
        if fact.digest is not None and fact.guessed:
            fact.json = None  # kept for the digest and the estimate until both were made
    recount = partial(recounted, wire, base, messages) if uncertain else None
    return Counted(fixed, counts, digests, breakpoints, forms, uncertain, keys, recount, view)


def recounted(
    wire: WireFormat,
    base: TokenCounter,
    messages: Sequence[Mapping[str, Any]],
    counted: Counted,
    indices: Sequence[int],
) -> Counted:
    """`counted` with the messages at `indices` counted exactly (each once: that count is
    kept, and found when asked again): the planner asks for it where an estimate could
    decide otherwise than the exact count (proxy/core/estimate.py)."""
    counter = wire.counter(base)
    counts, uncertain = list(counted.counts), list(counted.uncertain)
    for n in indices:
        if uncertain and uncertain[n]:
            key = counted.keys[n]
            exact = base.cached(key)
            if exact is None:
                exact = base.remember(key, counter.count_message(messages[n]))
            counts[n], uncertain[n] = exact, 0
    if not any(uncertain):
        uncertain = []
    return replace(counted, counts=counts, uncertain=uncertain)


_FORMS = [bytes([form]) for form in range(FORMS)]  # digests.Canonical.form, as a key's byte


def _facts(
    base: TokenCounter, seen: Seen | None, message: Mapping[str, Any], domains: list[bytes]
) -> Known:
    """What counting needs of a message: kept by `seen` when it parsed it before, else
    made from its JSON (once)."""
    known = seen.known_of(message) if seen is not None else Known(message)
    if known.key is None:
        shape = canonical(message, known.raw)
        known.raw = None
        known.size = len(shape.raw)  # the JSON as it came: what the bound is proved of
        known.sourced = b'"source"' in shape.raw
        known.form, known.breakpoints = shape.form, shape.breakpoints
        known.key, known.digest = _keyed(base, shape, domains[shape.form])
        known.json = shape.json
    return known


def _exact(base: TokenCounter, known: Known) -> int | None:
    """A message's exact count: kept with what `seen` kept of it, else from the cache."""
    if known.exact is None:
        known.exact = base.cached(known.key)
    return known.exact


def _guess(
    base: TokenCounter, known: Known, wire: WireFormat, message: Mapping[str, Any]
) -> int | None:
    """A tool result's estimate (made once, kept with it and under its own key), or None
    when the message is counted exactly: it gives no tool result (what stays in the
    history, a prompt or a reminder, is counted once, exactly, and adds no uncertainty to
    later requests; results are what the proxy offloads as they age), or it is small, an
    image or document, or of an odd mix of bytes."""
    if known.guessed:
        return known.guess
    key = estimate_key(known.key)
    guess = base.cached(key)
    if guess is None and not known.sourced and known.size >= ESTIMATE_MIN_BYTES:
        if not wire.gives_results(message):
            known.guess, known.guessed = None, True
            return None
        assert known.json is not None  # kept until the estimate is made
        guess = estimate_tokens(known.json)
        if guess is not None:
            base.remember(key, guess)
    known.guess, known.guessed = guess, True
    return guess


def estimate_key(key: CountKey) -> CountKey:
    """Where a message's estimate is kept: its count key in a domain of its own."""
    return b"~" + key[0], key[1], key[2]


def _digest(known: Known) -> bytes:
    if known.digest is None:
        assert known.json is not None
        known.digest = digest(known.json)
    return known.digest


def _outside(wire: Request, body: Mapping[str, Any], seen: Seen | None) -> int:
    """Breakpoints outside the messages (system, tools), kept while those are the same."""
    parts = tuple(body.get(name) for name in FIXED_FIELDS)
    found = seen.fixed_value("breakpoints", parts) if seen is not None else None
    if found is None:
        found = wire.breakpoints(body)
        if seen is not None:
            seen.keep_fixed("breakpoints", parts, found)
    return int(found)


def _keyed(base: TokenCounter, shape: Canonical, domain: bytes) -> tuple[CountKey, bytes | None]:
    """A message's count key, and its match digest if the key is made of that."""
    if len(shape.json) < DIGEST_KEYED_BYTES:
        return base.key(shape.json, domain), None
    made = digest(shape.json)
    return base.key(made, domain + b"#"), made


def history_bound(
    messages: Sequence[Mapping[str, Any]], cached: Sequence[int | None]
) -> int | None:
    """An upper bound of the history's estimate: cached counts as they are, each other
    message its JSON's bytes plus the per-message overhead; None when a new message
    holds a `source`."""
    facts = []
    for message in messages:
        shape = canonical(message)
        facts.append(Known(message, len(shape.raw), b'"source"' in shape.raw))
    return _bound(facts, cached)


def _bound(
    facts: Sequence[Known],
    cached: Sequence[int | None],
    guesses: Sequence[int | None] | None = None,
) -> int | None:
    """Cached counts as they are; a new message its estimate's upper margin when it has
    one, else its JSON's bytes (a hard bound)."""
    bound = 0
    for n, (known, count) in enumerate(zip(facts, cached, strict=True)):
        if count is not None:
            bound += count
            continue
        if known.sourced:
            return None
        hard = known.size + MESSAGE_OVERHEAD  # `{}` is 2 bytes and costs the overhead
        guess = guesses[n] if guesses is not None else None
        bound += min(hard, guess + margin(guess)) if guess is not None else hard
    return bound
