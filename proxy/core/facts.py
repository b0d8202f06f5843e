"""Facts a summary must keep: the identifiers of the turns it folds, checked by construction.

A summariser is a model and may drop an identifier the agent needs later (a path, an
error code, the id of a resource). After a summary is made, `keep_facts` finds the
identifiers of the folded turns that the summary does not contain and appends the most
telling of them, within a small token budget, as one compact line. Deterministic, so
every replica appends the same line.

What counts as an identifier (`identifiers`): file paths and file names, URLs of any
scheme (`s3://bucket/key`), function and class names (snake_case, camelCase, CamelCase,
`name(`), dotted names (`ledger.strict_mode`, `os.path.join`), error codes and constants
(`E1234`, `ERR_CONN_RESET`, `PLEDGR7`), host-like names with a digit (`ledger-pg-eu-3`,
`us-east-1`), ids (hex runs, uuids, `#1234`), versions (`1.2.3`), numbers with units
(`512 MiB`, `35 ms`) and numbers a keyword names (`port 6391`, `HTTP 409`, `pid 4242`,
`line 120`). Bare numbers and plain words are not.

Which go first when not all fit (`rank`): identifiers of a rare *shape* before those a
template printed many times (a log's thousand `module_3_17.py:248` lines share one shape
once digits are masked); among the rare ones, those from an earlier summary, then those
the user or the assistant wrote, then tool results; then the earliest. Ids a protocol
made up (tool call ids, message and request ids) are not facts and never listed; refs of
offloaded results rank with template values (the named-ref mechanism keeps them
readable).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

_UNITS = (
    r"ms|us|µs|ns|s|sec|secs|seconds|min|mins|minutes|h|hours|days|"
    r"B|KB|KiB|MB|MiB|GB|GiB|TB|TiB|kB|%|tokens|req/s|rps|qps|cores|"
    r"Hz|kHz|MHz|GHz|px|pt|em|rem|°C|°F|x"
)
_IDENTIFIER = re.compile(
    rf"""
      (?P<url>\b[a-z][a-z0-9+.-]*://[^\s<>"'`)\]}},]+)
    | (?P<number>\b(?:[Pp]ort|PORT|pid|PID|uid|gid|HTTP|[Ss]tatus|exit\ code|PR|[Ii]ssue|ticket
        |tenant|[Ll]ine)\s\#?\d{{2,}}\b)
    | (?P<path>(?:\.{{0,2}}/)?(?:[\w.@+-]+/)+[\w.@+-]+(?::\d+)?)
    | (?P<unit>\b\d+(?:\.\d+)?\s?(?:{_UNITS})(?![\w/]))
    | (?P<version>\bv?\d+\.\d+\.\d+(?:[-+.][\w.]+)?\b)
    | (?P<uuid>\b[0-9a-fA-F]{{8}}(?:-[0-9a-fA-F]{{4}}){{3}}-[0-9a-fA-F]{{12}}\b)
    | (?P<dotted>\b[A-Za-z_]\w+(?:\.[A-Za-z_]\w+){{2,}}\b|\b[A-Za-z_]\w+\.[A-Za-z]\w*_\w+\b)
    | (?P<file>\b[\w-]+\.(?:[A-Za-z][A-Za-z0-9]{{0,7}})\b(?::\d+)?)
    | (?P<call>\b[A-Za-z_][\w.]*(?=\())
    | (?P<code>\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b|\b[A-Z]{{1,6}}-?\d{{2,}}\b
        |\b[A-Z]{{3,}}\d[A-Z0-9]*\b)
    | (?P<host>\b[a-z][a-z0-9]*-(?=[a-z0-9-]*\d)[a-z0-9]+(?:-[a-z0-9]+)*\b)
    | (?P<snake>\b[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+\b)
    | (?P<camel>\b[a-z]+[A-Z][A-Za-z0-9]*\b|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b)
    | (?P<hex>\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{{8,}}\b)
    | (?P<issue>\#\d{{2,}}\b)
    """,
    re.VERBOSE,
)
_TRAILING = ".,;:!?'\""
_DIGITS = re.compile(r"\d+")
# Ids the APIs and the proxy make up: tool call, message, request ids, and refs.
_PROTOCOL_ID = re.compile(r"(?:toolu|srvtoolu|call|fc|fco|msg|req|chatcmpl|resp)_\w+")
_REF = re.compile(r"r_[0-9a-f]{16}")
TEMPLATED = 4  # identifiers of a shape seen this often came from a template
LINE_HEAD = "[compaction-proxy: identifiers from the folded turns, verbatim:"

# Where an identifier was seen, most telling first.
EARLIER_SUMMARY, CONVERSATION, TOOL_CALL, TOOL_RESULT = range(4)


def identifiers(text: str) -> list[str]:
    """The identifiers in `text`, in order of first appearance, each once."""
    seen: dict[str, None] = {}
    for match in _IDENTIFIER.finditer(text):
        found = match.group(0).rstrip(_TRAILING)
        if len(found) >= 3:
            seen.setdefault(found, None)
    return list(seen)


def shape(identifier: str) -> str:
    """The identifier with its digits masked: a template's values share one shape."""
    return _DIGITS.sub("#", identifier)


@dataclass(frozen=True, slots=True)
class Source:
    """A piece of folded text and where it came from (one of the four kinds above)."""

    kind: int
    text: str


def rank(sources: Iterable[Source], ignore: frozenset[str] = frozenset()) -> list[str]:
    """Every identifier of the sources, the most telling first (see the module doc);
    `ignore`: ids the protocol made up (tool call ids), not facts of the conversation."""
    kinds: dict[str, int] = {}
    order: dict[str, int] = {}
    shapes: Counter[str] = Counter()
    for source in sources:
        for found in identifiers(source.text):
            if found in ignore or _PROTOCOL_ID.fullmatch(found):
                continue
            if found not in kinds:
                order[found] = len(order)
                shapes[shape(found)] += 1
                kinds[found] = source.kind
            else:
                kinds[found] = min(kinds[found], source.kind)

    def key(found: str) -> tuple[bool, int, int, int]:
        count = shapes[shape(found)]
        templated = count >= TEMPLATED or _REF.fullmatch(found) is not None
        return templated, kinds[found], count, order[found]

    return sorted(kinds, key=key)


@dataclass(frozen=True, slots=True)
class Facts:
    """The folded turns' texts whose identifiers a summary must keep, ranked only when a
    summary has been made: ranking runs the identifier pattern over every folded text
    (tens of ms for a few dozen KB), which a turn that folds with a summary made ahead, or
    only checks that one is in the making, must not pay."""

    sources: tuple[Source, ...] = ()
    ignore: frozenset[str] = frozenset()  # ids the protocol made up (tool call ids)

    def ranked(self) -> list[str]:
        return rank(self.sources, self.ignore)


def missing(ranked: Sequence[str], summary: str) -> list[str]:
    """The ranked identifiers the summary does not contain verbatim."""
    return [found for found in ranked if found not in summary]


def keep_facts(
    summary: str,
    ranked: Sequence[str],
    budget: int,
    count: Callable[[str], int],
) -> str:
    """The summary with the identifiers it left out appended, most telling first, as
    many as fit `budget` tokens (as `count` counts them); unchanged when none is missing
    or none fits."""
    lost = missing(ranked, summary)
    if not lost:
        return summary
    kept: list[str] = []
    used = count(LINE_HEAD + "]")
    for found in lost:
        cost = count(found + ", ")
        if used + cost > budget:
            continue  # a shorter one further down may still fit
        kept.append(found)
        used += cost
    if not kept:
        return summary
    return f"{summary.rstrip()}\n{LINE_HEAD} {', '.join(kept)}]"
