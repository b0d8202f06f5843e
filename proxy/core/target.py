"""The request target, made canonical once: the one form routing, the admin guard, key
scopes and budgets read, and the form forwarded upstream.

A target is canonical when normalising it (RFC 3986: decoding percent-encoded
unreserved characters, removing dot segments) leaves it as it is, and when no part of it
can be read as a path separator by one reader and not by another. So these are refused:

- a target that is not a path (absolute-form `http://host/...`, `*`);
- a backslash, a `#`, a control or non-ASCII character, a space;
- a percent-encoded `/`, `\\`, `%` or unreserved character (`%2F`, `%5C`, `%25`, `%2E`,
  `%41`, ...), a `%` not followed by two hex digits, and an encoded control character;
- a dot segment (`/./`, `/../`, a trailing `/.` or `/..`) and an empty segment (`//`).

What remains has one reading: its decoded path (aiohttp's `request.path`) names the same
resource as its raw form (`request.raw_path`, forwarded as sent). Only the path is
checked; the query string passes through unchanged (invariant 5).
"""

from __future__ import annotations

_HEX = frozenset("0123456789abcdefABCDEF")
# What a percent-encoding must not hide: unreserved characters (a normaliser decodes
# them), separators some reader decodes (`/`, `\`), `%` itself (a second decoding), and
# control characters.
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ENCODED_NEVER = _UNRESERVED | frozenset("/\\%") | frozenset(chr(c) for c in range(0x20))
_ENCODED_NEVER |= frozenset("\x7f")
# Fast path: a target without these characters is canonical unless it has a dot or
# empty segment, checked next.
_SUSPECT = frozenset("%\\#")


def target_problem(raw_target: str) -> str | None:
    """Why a raw request target is not canonical (a sentence for a 400), else None."""
    path = raw_target.partition("?")[0]
    if path[:1] != "/":
        return f"The request target must be a path, got {raw_target[:200]!r}."
    if not path.isascii() or not path.isprintable() or " " in path:
        return "The request path may hold only printable ASCII characters."
    if not _SUSPECT.isdisjoint(path):
        if "\\" in path:
            return "The request path must not contain a backslash."
        if "#" in path:
            return "The request path must not contain '#'."
        problem = _encoding_problem(path)
        if problem is not None:
            return problem
    if "//" in path:
        return "The request path must not contain an empty segment ('//')."
    if "/." in path:
        for segment in path.split("/"):
            if segment in (".", ".."):
                return "The request path must not contain dot segments ('.' or '..')."
    return None


def _encoding_problem(path: str) -> str | None:
    at = path.find("%")
    while at != -1:
        pair = path[at + 1 : at + 3]
        if len(pair) != 2 or not _HEX.issuperset(pair):
            return "The request path has a '%' that is not a percent-encoding."
        char = chr(int(pair, 16))
        if char in _ENCODED_NEVER:
            return (
                f"The request path must not percent-encode {char!r} (%{pair}): send the"
                " path in its canonical form."
            )
        at = path.find("%", at + 3)
    return None
