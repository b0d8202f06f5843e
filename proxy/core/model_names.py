"""Model names a request may carry: bounded, so no client can grow the proxy's memory or
its store with them.

A model name keys per-model state (calibration factors in memory and in Redis, policy
lookups, log fields). Names are checked when a request is read: at most MAX_CHARS
characters from a small set that covers every provider's naming (`claude-sonnet-4-5`,
`ft:gpt-4o-mini:org:name:id`, `anthropic/claude-3.5-sonnet`, `claude@20240620`,
`name[1m]`); anything else is refused with 400 before it costs anything. Store keys
never hold the name itself, only `model_digest(name)`.

Claude on Amazon Bedrock and Google Vertex AI is named by the provider's id
(`us.anthropic.claude-sonnet-4-5-20250929-v1:0`, `claude-sonnet-4-5@20250929`):
`anthropic_name` gives the name Anthropic's API uses for the same model, so model facts,
policies and prices apply to all three alike.
"""

from __future__ import annotations

import hashlib
import re
from fnmatch import fnmatchcase

MAX_CHARS = 256
_NAME = re.compile(r"[A-Za-z0-9._:/@+=\[\]-]+")


def model_problem(value: object) -> str | None:
    """Why `value` is not an acceptable model name, or None."""
    if not isinstance(value, str):
        return f"model: must be a string, got {type(value).__name__}"
    if len(value) > MAX_CHARS:
        return f"model: at most {MAX_CHARS} characters, got {len(value)}"
    if _NAME.fullmatch(value) is None:
        return "model: letters, digits and . _ : / @ + = [ ] - only"
    return None


def model_digest(model: str) -> str:
    """A fixed-size stand-in for a model name in store keys."""
    return hashlib.blake2b(model.encode(), digest_size=12).hexdigest()


# A Bedrock model id: an optional ARN up to the resource's `/`, an optional inference
# profile's geography (`us.`, `eu.`, `apac.`, `us-gov.`, `global.`...), `anthropic.`,
# the name, and a version suffix (`-v1:0`, `-v2:0`, `-v1`).
_BEDROCK = re.compile(
    r"^(?:arn:[^/]*/)?(?:[a-z]{2,6}(?:-[a-z]+)?\.)?anthropic\.(?P<name>[a-z0-9.-]+?)"
    r"(?:-v\d+(?::\d+)?)?$"
)
# A Vertex model id: the name, then `@` and a date (`claude-sonnet-4-5@20250929`).
_VERTEX = re.compile(r"^(?P<name>claude[a-z0-9.-]*)@(?P<date>\d{8})$")


def anthropic_name(model: str) -> str:
    """The Anthropic API's name for a Bedrock or Vertex model id; any other name as is."""
    lowered = model.strip().lower()
    if (bedrock := _BEDROCK.match(lowered)) is not None:
        return bedrock["name"]
    if (vertex := _VERTEX.match(lowered)) is not None:
        return f"{vertex['name']}-{vertex['date']}"
    return model


def model_matches(model: str, glob: str) -> bool:
    """Whether a `[[policy]]` or `[[price]]` glob covers the model, by its own name or by
    its Anthropic name (so `claude-sonnet-*` covers it on Bedrock and Vertex too)."""
    if fnmatchcase(model, glob):
        return True
    named = anthropic_name(model)
    return named != model and fnmatchcase(named, glob)
