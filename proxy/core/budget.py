"""Token budgets, pure: periods and their buckets, what a request reserves, what a
reported usage costs.

A budget limits, per key or per team, three amounts over a fixed calendar period (UTC):
`input` (every input token: fresh, cache-written and cache-read), `output`, and
`weighted` input (input priced as the prompt cache bills it: fresh 1x, 5-minute cache
writes 1.25x, 1-hour writes 2x, reads 0.1x). A request reserves its estimate before it is
forwarded and settles to what the upstream reports afterwards; see proxy/store/accounts.py
for how that stays atomic across replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.core.policy import Policy, PolicyError

PERIODS = ("minute", "day", "month")
METRICS = ("input", "output", "weighted")
# Per-key or per-team context policy fields that may override the model's policy.
POLICY_FIELDS = ("window", "trigger", "target")

_DAY = 86_400


@dataclass(frozen=True, slots=True)
class Amounts:
    input: int = 0
    output: int = 0
    weighted: int = 0

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.input, self.output, self.weighted)

    def minus(self, other: Amounts) -> Amounts:
        return Amounts(
            self.input - other.input, self.output - other.output, self.weighted - other.weighted
        )

    def plus(self, other: Amounts) -> Amounts:
        return Amounts(
            self.input + other.input, self.output + other.output, self.weighted + other.weighted
        )


# -- periods -------------------------------------------------------------------------


def _civil_from_days(days: int) -> tuple[int, int]:
    """(year, month) of a day counted from 1970-01-01 (proleptic Gregorian)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    return year, month


def _days_from_civil(year: int, month: int) -> int:
    """Days from 1970-01-01 to the first day of (year, month)."""
    y = year - 1 if month <= 2 else year
    era = y // 400
    yoe = y - era * 400
    mp = month - 3 if month > 2 else month + 9
    doy = (153 * mp + 2) // 5
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


@dataclass(frozen=True, slots=True)
class Bucket:
    period: str
    name: str  # part of the counter's key: which minute, day or month
    ends_in: int  # whole seconds until the bucket closes (at least 1)


def bucket(period: str, now: float) -> Bucket:
    """The bucket of `period` that `now` (Unix seconds, UTC) falls in."""
    second = int(now // 1)
    if period == "minute":
        start, end, name = second - second % 60, second - second % 60 + 60, str(second // 60)
    elif period == "day":
        day = second // _DAY
        start, end, name = day * _DAY, (day + 1) * _DAY, str(day)
    elif period == "month":
        year, month = _civil_from_days(second // _DAY)
        nxt = (year + 1, 1) if month == 12 else (year, month + 1)
        start = _days_from_civil(year, month) * _DAY
        end = _days_from_civil(*nxt) * _DAY
        name = f"{year:04d}{month:02d}"
    else:
        raise ValueError(f"unknown budget period {period!r}; known: {', '.join(PERIODS)}")
    assert start <= second < end
    return Bucket(period, name, max(1, end - second))


# -- reservations and costs ----------------------------------------------------------


def reservation(estimated_input: int, max_tokens: int, *, one_hour_cache: bool) -> Amounts:
    """What a request holds while it runs: its estimated input, `max_tokens` of output
    (the API never generates more in one call), and weighted input as if every input
    token were written to the cache (the dearest case: 1.25x, 2x for 1-hour entries)."""
    estimated_input = max(0, estimated_input)
    weight = 200 if one_hour_cache else 125
    return Amounts(estimated_input, max(0, max_tokens), -(-estimated_input * weight // 100))


def _int(usage: Mapping[str, object], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_cost(usage: Mapping[str, object]) -> Amounts:
    """What one upstream answer's reported usage costs (Anthropic's usage fields; an
    OpenAI usage is mapped onto them by the meter)."""
    fresh = _int(usage, "input_tokens")
    written = _int(usage, "cache_creation_input_tokens")
    read = _int(usage, "cache_read_input_tokens")
    detail = usage.get("cache_creation")
    hour = 0
    if isinstance(detail, Mapping):
        hour = min(written, _int(detail, "ephemeral_1h_input_tokens"))
    weighted_hundredths = 100 * fresh + 125 * (written - hour) + 200 * hour + 10 * read
    return Amounts(
        fresh + written + read, _int(usage, "output_tokens"), -(-weighted_hundredths // 100)
    )


# -- what a request asks the upstream to generate ------------------------------------

DEFAULT_MAX_OUTPUT = 4_096  # reserved per choice when a request names no output cap
MAX_OUTPUT = 100_000_000  # no model generates more in one call: a larger cap is refused
MAX_CHOICES = 128  # OpenAI's own limit on `n`
# Output caps of the APIs (Messages, Chat, Responses, legacy Text Completions): the
# largest given is reserved. `n` (choices) and `best_of` (candidates generated) multiply it.
OUTPUT_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "max_tokens_to_sample")
CHOICE_FIELDS = ("n", "best_of")
# The Gemini API's: its output cap and candidates (camelCase or snake_case alike).
GEMINI_CONFIG = ("generationConfig", "generation_config")


class BadRequestField(ValueError):
    """A field a budget must read is not what the API allows; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _whole(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequestField(
            name, f"{name}: must be a whole number from {low} to {high}, got {value!r}"
        )
    return value


def output_reservation(payload: Mapping[str, Any]) -> int:
    """The output tokens a request may make the upstream generate: its largest output
    cap (DEFAULT_MAX_OUTPUT when it names none) times the choices it asks for. Raises
    BadRequestField for a cap or a count that is not a whole number in range (a float
    such as 6.4e4 or 1e17 included), so what is reserved is what the API will obey."""
    caps = [
        _whole(name, payload[name], 0, MAX_OUTPUT)
        for name in OUTPUT_CAPS
        if payload.get(name) is not None
    ]
    choices = [
        _whole(name, payload[name], 1, MAX_CHOICES)
        for name in CHOICE_FIELDS
        if payload.get(name) is not None
    ]
    for name in GEMINI_CONFIG:  # Gemini's are in its generationConfig
        config = payload.get(name)
        if isinstance(config, Mapping):
            caps += _given(name, config, ("maxOutputTokens", "max_output_tokens"), 0, MAX_OUTPUT)
            choices += _given(name, config, ("candidateCount", "candidate_count"), 1, MAX_CHOICES)
    return max(caps, default=DEFAULT_MAX_OUTPUT) * max(choices, default=1)


def _given(
    where: str, config: Mapping[str, Any], names: tuple[str, ...], low: int, high: int
) -> list[int]:
    return [
        _whole(f"{where}.{n}", config[n], low, high) for n in names if config.get(n) is not None
    ]


def batch_reservation(
    payload: Mapping[str, Any], count: Callable[[dict[str, Any]], int]
) -> tuple[int, int]:
    """(input, output) of a Message Batch: every request's params counted with `count`
    and its output reservation, summed. BadRequestField when the batch is malformed."""
    requests = payload.get("requests")
    if not isinstance(requests, list) or not requests:
        raise BadRequestField("requests", "requests: must be a non-empty list")
    total_input = total_output = 0
    for n, item in enumerate(requests):
        params = item.get("params") if isinstance(item, Mapping) else None
        if not isinstance(params, dict):
            raise BadRequestField(f"requests.{n}.params", f"requests.{n}.params: must be an object")
        where = f"requests.{n}.params."
        try:
            total_output += output_reservation(params)
        except BadRequestField as e:
            raise BadRequestField(where + e.param, where + str(e)) from None
        total_input += count(params)
    return total_input, total_output


# -- limits and policy overrides -----------------------------------------------------


def limit_field(period: str, metric: str) -> str:
    if period not in PERIODS:
        raise ValueError(f"unknown budget period {period!r}; known: {', '.join(PERIODS)}")
    if metric not in METRICS:
        raise ValueError(f"unknown budget metric {metric!r}; known: {', '.join(METRICS)}")
    return f"{period}:{metric}"


def limits_of(conf: Mapping[str, str]) -> dict[tuple[str, str], int]:
    """The limits in a stored key or team configuration (fields `period:metric`)."""
    out: dict[tuple[str, str], int] = {}
    for period in PERIODS:
        for metric in METRICS:
            raw = conf.get(f"{period}:{metric}")
            if raw is not None and raw.lstrip("-").isdigit():
                out[(period, metric)] = int(raw)
    return out


def policy_override(*confs: Mapping[str, str]) -> dict[str, int]:
    """The context-policy fields of stored configurations; later ones win (team, then
    key)."""
    out: dict[str, int] = {}
    for conf in confs:
        for name in POLICY_FIELDS:
            raw = conf.get(f"policy:{name}")
            if raw is not None and raw.isdigit():
                out[name] = int(raw)
    return out


def override_problem(override: Mapping[str, Any], policies: Sequence[Policy]) -> str | None:
    """Why a key's or team's window/trigger/target cannot stand over one of `policies`
    (what a request of a model matching it would get), or None when it fits them all.
    Policies after one matching every model (`*`) are never used, so not checked."""
    for policy in policies:
        try:
            replace(policy, **override).validate()
        except PolicyError as e:
            reason = str(e).split(": ", 1)[-1]
            return f"for models matching {policy.match!r}: {reason}"
        if policy.match == "*":
            break
    return None


def over_limit_message(
    scope: str, period: str, metric: str, used: int, want: int, limit: int
) -> str:
    if want > limit:
        return (
            f"This request needs {want} {metric} tokens, more than the {scope}'s whole"
            f" {period} budget of {limit}."
        )
    return (
        f"The {scope}'s {period} budget of {limit} {metric} tokens is used up"
        f" ({used} used or reserved, this request needs {want})."
    )
