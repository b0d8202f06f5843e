"""Counting one request, once: what every later step reads.

Before planning, the proxy needs each message's estimated tokens and its match digest
(proxy/core/checkpoint.py). `count_request` makes one pass per message for both: it
serialises the message once, hashes it once, and looks its count up under that hash, so a
history whose messages were seen before costs a hash per message and nothing more.

`cannot_cross` answers from the body's size alone when even that is enough to know the
history is under the trigger and the window, so most small requests are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.checkpoint import fingerprint
from proxy.core.policy import Policy
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import MessageCounter, WireFormat

# Estimated tokens a body can hold beyond one per byte (the tools preamble and such).
BYTE_BOUND_SLACK = 1024


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


@dataclass(frozen=True, slots=True)
class Counted:
    fixed: int  # system prompt + tools, estimated
    counts: list[int]  # each message, estimated
    digests: list[bytes]  # each message's match digest
    breakpoints: int = 0  # cache_control breakpoints in the messages
    # Per message, what its digest is of (checkpoint.fingerprint's form byte): 0 its exact
    # bytes, 1 its string content as one text block; 2 and 3 with cache_control left out,
    # which is not enough to rebuild it by digest (segments.StubbedMemo).
    forms: bytes = b""

    @property
    def history(self) -> int:
        return sum(self.counts)

    @property
    def total(self) -> int:
        return self.history + self.fixed

    def fits(self, policy: Policy, factor: float) -> bool:
        """Under the window and below anything the policy does (offload, a summary made
        ahead, a fold), calibrated: nothing to plan."""
        history = self.history
        return (history + self.fixed) * factor <= policy.window and (
            history * factor <= policy.quiet_tokens
        )


def count_request(
    wire: WireFormat,
    base: TokenCounter,
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
) -> Counted:
    counter = wire.counter(base)
    domain = wire.name.encode() + b":"
    counts: list[int] = []
    digests: list[bytes] = []
    forms = bytearray()
    breakpoints = 0
    for message in messages:
        print_ = fingerprint(message)
        digests.append(print_.match)
        forms.append(print_.count_key[-1])
        breakpoints += print_.breakpoints
        counts.append(base.remembered(domain + print_.count_key, _counting(counter, message)))
    fixed = wire.fixed_tokens(counter, body)
    return Counted(fixed, counts, digests, breakpoints, bytes(forms))


def _counting(counter: MessageCounter, message: Mapping[str, Any]) -> Any:
    return lambda: counter.count_message(message)
