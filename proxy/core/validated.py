"""Validate only what is new: what a conversation line's validations found, kept for its
next request.

Before the proxy rewrites or summarises a request it checks it, and its rewrite, against
the API's rules (proxy/wire/*_validation.py; docs/compaction.md, "Invalid requests"). The
rules walk the whole history, and an agent's next request repeats the very message objects
of its last one up to its newest turns (the reuse cache, proxy/core/reuse.py, hands the
parsed messages on), as a rewrite repeats the stubs the line built before. So per line
`Validated` keeps the histories found valid lately (`Chain`: at most CHAINS of them,
least recently found first out), each with its validator's state after each of its
messages but the last; the next validation resumes from the state after the longest run
of the same objects (`is`) its history starts with, and walks only the rest. A message
object held here is the same message: nothing changes a parsed body in place (reuse.py).

The state is the format's (what its rules need of the history before a message: the
tool-call ids seen, the turn being read, the cache breakpoints so far); a validator that
keeps none walks every message, as without this module. Only a history found valid is
kept, and only whether a request is valid is decided this way: a request found invalid is
validated again in full for the API's own message, so a miss, or an invalid request, costs
what a full validation costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# The histories kept per line: the client's request and the rewrite of it, and one more
# (a summary's request in place, a rewind).
CHAINS = 3


@dataclass(slots=True)
class Chain:
    """One history found valid: its message objects (held), the validator's state after
    each of them but the last (`states[j]`: after `messages[: j + 1]`), and what it found
    of the body's other parts (`outside`: those parts' objects, held; `value`: what the
    validator keeps of them)."""

    messages: list[object]
    states: list[object]
    outside: tuple[object, ...] = ()
    value: object = None


@dataclass(slots=True)
class Validated:
    """The chains of one conversation line (bounded: CHAINS), most recent last."""

    chains: list[Chain] = field(default_factory=list)

    def resume(self, messages: Sequence[object]) -> tuple[int, Chain | None]:
        """How many of `messages`' first objects a kept chain has a state after (at most
        all but the last: the last message of a history is checked as the last), and that
        chain (None: none, the walk starts at the first message), now the most recently
        used."""
        best, found = 0, None
        most = len(messages) - 1
        for chain in self.chains:
            shared = _same_objects(chain.messages, messages, min(most, len(chain.states)))
            if shared > best:
                best, found = shared, chain
        if found is not None and found is not self.chains[-1]:
            self.chains.remove(found)
            self.chains.append(found)
        return best, found

    def outside_value(self, parts: tuple[object, ...]) -> object:
        """What a kept chain found of these very objects besides the history (None: no
        chain has them)."""
        for chain in reversed(self.chains):
            kept = chain.outside
            if len(kept) == len(parts) and all(a is b for a, b in zip(kept, parts, strict=True)):
                return chain.value
        return None

    def keep(self, chain: Chain, resumed: Chain | None = None, shared: int = 0) -> None:
        """Keep a history found valid. The chain it resumed from goes when the new one
        holds all its states (`shared` of its messages are the new one's: the history
        grew), else it stays for a history that repeats more of it (a line's rewrite,
        which moves its breakpoint, beside the client's history); the least recently used
        go beyond CHAINS."""
        chains = self.chains
        if resumed is not None and shared >= len(resumed.states):
            chains = [kept for kept in chains if kept is not resumed]
        chains.append(chain)
        del chains[:-CHAINS]
        self.chains = chains


def _same_objects(kept: Sequence[object], messages: Sequence[object], most: int) -> int:
    """How many first elements of both are the same objects, at most `most`."""
    for n in range(most):
        if kept[n] is not messages[n]:
            return n
    return max(most, 0)
