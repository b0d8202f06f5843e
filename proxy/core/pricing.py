"""What a request's usage costs: the prompt-cache model, and prices per model when known.

Two ways to price one upstream answer's usage (Anthropic's fields; OpenAI usage mapped
onto them):

- `CACHE_MODEL`, relative units with no currency: uncached input 1.0, 5-minute cache
  write 1.25, 1-hour cache write 2.0, cache read 0.1, output 5.0 per token. This is how
  the API bills relative to its input price, so ratios (with / without the proxy) are
  true for every model even when no price is known.
- A `PriceTable`: the model table's prices (proxy/core/model_facts.py, in USD),
  overridden by `[[price]]` config tables, per model glob, in a currency per million
  tokens (e.g. USD 3.00 input, 3.75 write, 0.30 read, 15.00 output). A table names every
  rate it sets; the ones it leaves out follow from `input` by the cache model's ratios
  (write 1.25x, 1-hour write 2x, read 0.1x) and output is required.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.model_facts import BUILTIN
from proxy.core.model_names import model_matches

PER_MILLION = 1_000_000


class PriceError(ValueError):
    """A `[[price]]` table is wrong; the message names it."""


@dataclass(frozen=True, slots=True)
class Rates:
    """Price per token of each kind of token, in `unit` (a currency or "units")."""

    input: float
    cache_write: float  # 5-minute cache write
    cache_write_1h: float
    cache_read: float
    output: float
    unit: str = "units"

    def cost(self, usage: Mapping[str, Any]) -> float:
        fresh = _int(usage, "input_tokens")
        written = _int(usage, "cache_creation_input_tokens")
        read = _int(usage, "cache_read_input_tokens")
        output = _int(usage, "output_tokens")
        detail = usage.get("cache_creation")
        hour = 0
        if isinstance(detail, Mapping):
            hour = min(written, _int(detail, "ephemeral_1h_input_tokens"))
        return (
            fresh * self.input
            + (written - hour) * self.cache_write
            + hour * self.cache_write_1h
            + read * self.cache_read
            + output * self.output
        )


CACHE_MODEL = Rates(input=1.0, cache_write=1.25, cache_write_1h=2.0, cache_read=0.1, output=5.0)


@dataclass(frozen=True, slots=True)
class Price:
    """One `[[price]]` table: rates per million tokens for the models its glob fits."""

    match: str
    rates: Rates  # per token


@dataclass(frozen=True, slots=True)
class PriceTable:
    prices: tuple[Price, ...] = ()
    # Whether models no `[[price]]` fits are priced from the model table (USD).
    from_model_table: bool = True

    def rates_for(self, model: str) -> Rates | None:
        """The first matching table's rates, else the model table's (USD), or None when
        the model has no price."""
        found = next((p.rates for p in self.prices if model_matches(model, p.match)), None)
        if found is None and self.from_model_table:
            return table_rates(model)
        return found

    def cost(self, model: str, usage: Mapping[str, Any]) -> tuple[float, str]:
        """(cost, unit): in the model's currency when priced, else in cache-model units."""
        rates = self.rates_for(model) or CACHE_MODEL
        return rates.cost(usage), rates.unit

    @property
    def currencies(self) -> frozenset[str]:
        return frozenset(p.rates.unit for p in self.prices)


_FIELDS = ("match", "currency", "input", "cache_write", "cache_write_1h", "cache_read", "output")


def parse_price_table(raw: Sequence[Mapping[str, Any]]) -> PriceTable:
    """Price tables from config, in order (the first whose `match` fits a model wins)."""
    prices = []
    for n, table in enumerate(raw):
        where = f"price #{n + 1}"
        if not isinstance(table, Mapping):
            raise PriceError(f"{where} must be a table")
        unknown = sorted(set(table) - set(_FIELDS))
        if unknown:
            valid = ", ".join(_FIELDS)
            raise PriceError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: {valid}")
        match = table.get("match", "*")
        currency = table.get("currency", "USD")
        if not isinstance(match, str) or not match:
            raise PriceError(f"{where}: match must be a non-empty glob string")
        if not isinstance(currency, str) or not currency.strip():
            raise PriceError(f"{where}: currency must be a non-empty string")
        for required in ("input", "output"):
            if required not in table:
                raise PriceError(f"{where} ({match}): {required} is required (per million tokens)")
        values: dict[str, float] = {}
        for name in _FIELDS[2:]:
            if name not in table:
                continue
            value = table[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise PriceError(f"{where} ({match}): {name} must be a number >= 0, got {value!r}")
            values[name] = float(value)
        base = values["input"]
        per_million = Rates(
            input=base,
            cache_write=values.get("cache_write", base * CACHE_MODEL.cache_write),
            cache_write_1h=values.get("cache_write_1h", base * CACHE_MODEL.cache_write_1h),
            cache_read=values.get("cache_read", base * CACHE_MODEL.cache_read),
            output=values["output"],
        )
        rates = Rates(
            input=per_million.input / PER_MILLION,
            cache_write=per_million.cache_write / PER_MILLION,
            cache_write_1h=per_million.cache_write_1h / PER_MILLION,
            cache_read=per_million.cache_read / PER_MILLION,
            output=per_million.output / PER_MILLION,
            unit=currency.strip(),
        )
        prices.append(Price(match, rates))
    return PriceTable(tuple(prices))


def table_rates(model: str) -> Rates | None:
    """The model table's prices of a model, per token in USD (the cache rates it lacks
    follow from its input price by the cache model's ratios), or None."""
    facts = BUILTIN.lookup(model)
    if facts is None or facts.price is None:
        return None
    base, output, read, write, write_1h = facts.price
    assert base is not None and output is not None
    return Rates(
        input=base / PER_MILLION,
        cache_write=(write if write is not None else base * CACHE_MODEL.cache_write) / PER_MILLION,
        cache_write_1h=(write_1h if write_1h is not None else base * CACHE_MODEL.cache_write_1h)
        / PER_MILLION,
        cache_read=(read if read is not None else base * CACHE_MODEL.cache_read) / PER_MILLION,
        output=output / PER_MILLION,
        unit="USD",
    )


def _int(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
