"""Proxy keys, teams, their budgets and usage counters in Redis.

Key names (each scope is one Redis Cluster hash tag, so one slot):

    {prefix}{pk:<key id>}:key                  the key's record (hash): digest, team, ...
    {prefix}{pk:<key id>}:conf                 its limits and policy override (hash)
    {prefix}{pk:<key id>}:use:<period>         its counters for the current bucket of one
                                               period (hash: bucket, input, output, weighted)
    {prefix}{team:<name>}:conf / :use:...      the same for a team
    {prefix}g:keys:index                       the ids of every key (a set)

None of these keys has a TTL, so a Redis that evicts under memory pressure with a
``volatile-*`` policy (the embedded one: ``volatile-lru``) never evicts them: a counter
that vanished would silently give a budget back. Counters need no TTL to stay small: each
period's hash holds only its current bucket, and the first reservation of a new bucket
starts it afresh. A settlement that arrives after its bucket closed is dropped, as the
closed bucket no longer admits anything.

Reserving is one Lua script per scope: it reads the scope's limits and counters and, only
if every limited amount still fits, adds the reservation, all within one slot and so
atomic on a single Redis and on a Cluster alike. A request of a key in a team runs it on
the key's slot, then on the team's; if the team refuses, the key's reservation is taken
back. Between those two steps the key holds a reservation it may not keep, which can make
a concurrent request of the same key be refused: the split errs towards refusing, never
towards admitting more (see docs/fleet.md, "Over-admission").
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, cast

from proxy.core import proxy_keys
from proxy.core.budget import METRICS, PERIODS, Amounts, bucket
from proxy.store.redis import Store

# KEYS[1] the scope's conf, KEYS[2..4] the counters of each period (minute, day, month);
# ARGV[1..3] the amounts wanted (input, output, weighted: whole numbers below 2^53, so
# Lua compares them exactly), ARGV[4..6] each period's current bucket. A counter holding
# another bucket counts as empty, and is started afresh when added to. Returns
# {1, periods touched...} when admitted, {0, period, metric, used, limit} when not.
_RESERVE = """
local metrics = {'input', 'output', 'weighted'}
local periods = {'minute', 'day', 'month'}
local want = {tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])}
local conf = redis.call('HGETALL', KEYS[1])
local limits = {}
for i = 1, #conf, 2 do limits[conf[i]] = tonumber(conf[i + 1]) end
local touched = {}
for p = 1, 3 do
  local current = redis.call('HGET', KEYS[p + 1], 'bucket') == ARGV[3 + p]
  local limited = false
  for m = 1, 3 do
    local limit = limits[periods[p] .. ':' .. metrics[m]]
    if limit then
      limited = true
      local used = 0
      if current then used = tonumber(redis.call('HGET', KEYS[p + 1], metrics[m]) or '0') end
      if used + want[m] > limit then return {0, p, m, used, limit} end
    end
  end
  if limited then touched[#touched + 1] = p end
end
for _, p in ipairs(touched) do
  if redis.call('HGET', KEYS[p + 1], 'bucket') ~= ARGV[3 + p] then
    redis.call('DEL', KEYS[p + 1])
    redis.call('HSET', KEYS[p + 1], 'bucket', ARGV[3 + p])
  end
  for m = 1, 3 do
    -- ARGV's own text: a Lua number above 1e14 would go back to Redis as "1e+17".
    if want[m] ~= 0 then redis.call('HINCRBY', KEYS[p + 1], metrics[m], ARGV[m]) end
  end
end
local reply = {1}
for _, p in ipairs(touched) do reply[#reply + 1] = p end
return reply
"""

# A charge: the reservation script's keys and arguments, without its check. Usage that
# already happened (a summary made for the caller, what was admitted while Redis was
# away) is added to the current bucket of every limited period, whatever the limits say:
# a charge is never refused, and a counter may end above its limit. Returns the periods
# touched.
_CHARGE = """
local metrics = {'input', 'output', 'weighted'}
local periods = {'minute', 'day', 'month'}
local conf = redis.call('HGETALL', KEYS[1])
local limited = {}
for i = 1, #conf, 2 do
  for p = 1, 3 do
    if string.sub(conf[i], 1, #periods[p] + 1) == periods[p] .. ':' then limited[p] = true end
  end
end
local touched = {}
for p = 1, 3 do
  if limited[p] then
    if redis.call('HGET', KEYS[p + 1], 'bucket') ~= ARGV[3 + p] then
      redis.call('DEL', KEYS[p + 1])
      redis.call('HSET', KEYS[p + 1], 'bucket', ARGV[3 + p])
    end
    for m = 1, 3 do
      if tonumber(ARGV[m]) ~= 0 then redis.call('HINCRBY', KEYS[p + 1], metrics[m], ARGV[m]) end
    end
    touched[#touched + 1] = p
  end
end
return touched
"""

# KEYS: counters a reservation touched; ARGV[1..3]: what to add (negative: give back),
# ARGV[3 + i]: the bucket KEYS[i] was reserved in. A counter that has moved on to a later
# bucket since (a stream longer than its period) is left alone.
_SETTLE = """
local metrics = {'input', 'output', 'weighted'}
for i, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'bucket') == ARGV[3 + i] then
    for m = 1, 3 do
      if tonumber(ARGV[m]) ~= 0 then redis.call('HINCRBY', key, metrics[m], ARGV[m]) end
    end
  end
end
return #KEYS
"""


@dataclass(frozen=True, slots=True)
class Scope:
    kind: str  # "key" or "team"
    name: str

    @property
    def tag(self) -> str:
        return f"pk:{self.name}" if self.kind == "key" else f"team:{self.name}"

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True, slots=True)
class Held:
    """A reservation that was admitted: what it holds and where."""

    scope: Scope
    counters: tuple[str, ...]  # the counters it was added to: "<counter key>:<bucket>"
    amounts: Amounts


@dataclass(frozen=True, slots=True)
class Refused:
    scope: Scope
    period: str
    metric: str
    used: int
    limit: int
    retry_after: int  # seconds until the period's bucket closes


MAX_AMOUNT = 2**53 - 1  # what Lua (doubles) and HINCRBY (int64) both hold exactly


def check_amounts(amounts: Amounts, *, signed: bool = False) -> None:
    """Refuse amounts a script could not count exactly (a bug upstream of here: the
    server bounds what a request may reserve before it gets this far)."""
    low = -MAX_AMOUNT if signed else 0
    for value in amounts.as_tuple():
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_AMOUNT:
            raise ValueError(f"budget amounts must be whole numbers up to 2^53, got {amounts}")


def _text(mapping: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in mapping.items()
    }


class Accounts:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.prefix = store.prefix
        self._reserve = store.register_script(_RESERVE)
        self._settle = store.register_script(_SETTLE)
        self._charge = store.register_script(_CHARGE)

    # -- key names ---------------------------------------------------------------------

    def _key(self, scope: Scope, rest: str) -> str:
        return f"{self.prefix}{{{scope.tag}}}:{rest}"

    def _index(self) -> str:
        return f"{self.prefix}g:keys:index"

    def _counter(self, scope: Scope, period: str) -> str:
        return self._key(scope, f"use:{period}")

    # -- keys ----------------------------------------------------------------------------

    async def create_key(
        self,
        *,
        team: str,
        upstream_env: str,
        upstream_scheme: str = "x-api-key",
        name: str = "",
        tenant: str = "",
        provider: str = "anthropic",
        scopes: tuple[str, ...] = (),
    ) -> tuple[str, dict[str, str]]:
        """A new key: its text (shown once, never stored) and its record. The key is
        bound to `provider`'s API, reaches paths beyond the metered routes only through
        `scopes`, and shares `tenant`'s conversations (empty: its own); see
        proxy/core/proxy_keys.py."""
        proxy_keys.check_team(team)
        proxy_keys.check_env_name(upstream_env)
        proxy_keys.check_scheme(upstream_scheme)
        proxy_keys.check_tenant(tenant)
        proxy_keys.check_provider(provider)
        granted = proxy_keys.check_scopes(scopes)
        key_id = secrets.token_hex(6)
        text = proxy_keys.format_key(key_id, secrets.token_urlsafe(32))
        record = {
            "id": key_id,
            "digest": proxy_keys.digest(text),
            "team": team,
            "upstream_env": upstream_env,
            "upstream_scheme": upstream_scheme,
            "name": name,
            "created": str(int(time.time())),
            "revoked": "0",
            "provider": provider,
            "scopes": ",".join(granted),
        }
        if tenant:
            record["tenant"] = tenant
        scope = Scope("key", key_id)
        client = self.store.client
        mapping: dict[Any, Any] = dict(record)
        await self.store.run(lambda: client.hset(self._key(scope, "key"), mapping=mapping))
        await self.store.run(lambda: client.sadd(self._index(), key_id))
        return text, record

    async def get_key(self, key_id: str) -> dict[str, str] | None:
        client = self.store.client
        found = await self.store.run(lambda: client.hgetall(self._key(Scope("key", key_id), "key")))
        return _text(found) if found else None

    async def list_keys(self) -> list[dict[str, str]]:
        client = self.store.client
        ids = await self.store.run(lambda: client.smembers(self._index()))
        records = []
        for raw in sorted(ids):
            record = await self.get_key(raw.decode() if isinstance(raw, bytes) else str(raw))
            if record is not None:
                records.append(record)
        return records

    async def revoke_key(self, key_id: str) -> bool:
        record_key = self._key(Scope("key", key_id), "key")
        client = self.store.client
        if not await self.store.run(lambda: client.exists(record_key)):
            return False
        await self.store.run(lambda: client.hset(record_key, "revoked", "1"))
        # Told at once to every replica listening (proxy/server/fleet.py), so one that
        # loses Redis just after still knows; the record is what every other check reads.
        channel = self.revocations_channel()
        await self.store.run(lambda: client.publish(channel, key_id))
        # Redis answers PUBLISH before it writes the message to the subscribers (it writes
        # the clients it queued last first): a Redis that dies between those writes has
        # told the revoker and no replica. It takes up another command only after writing
        # them all, so one more round trip makes the revocation out of Redis when this
        # returns (on a Cluster: out of the node it was published on).
        await self.store.run(lambda: client.ping())
        return True

    def revocations_channel(self) -> str:
        return f"{self.prefix}g:keys:revoked"

    # -- limits and policy ---------------------------------------------------------------

    async def get_conf(self, scope: Scope) -> dict[str, str]:
        client = self.store.client
        return _text(await self.store.run(lambda: client.hgetall(self._key(scope, "conf"))))

    async def set_conf(self, scope: Scope, values: dict[str, int | None]) -> dict[str, str]:
        """Set fields (`minute:input`, `policy:window`, ...); None removes one."""
        conf_key = self._key(scope, "conf")
        client = self.store.client
        keep: dict[Any, Any] = {k: str(v) for k, v in values.items() if v is not None}
        drop = [k for k, v in values.items() if v is None]
        if keep:
            await self.store.run(lambda: client.hset(conf_key, mapping=keep))
        if drop:
            await self.store.run(lambda: client.hdel(conf_key, *drop))
        return await self.get_conf(scope)

    # -- reservations --------------------------------------------------------------------

    async def reserve(self, scope: Scope, want: Amounts, now: float) -> Held | Refused:
        check_amounts(want)
        buckets = [bucket(p, now) for p in PERIODS]
        counters = [self._counter(scope, p) for p in PERIODS]
        keys = [self._key(scope, "conf"), *counters]
        args = [*want.as_tuple(), *(b.name for b in buckets)]
        reply = await self.store.run(lambda: self._reserve(keys=keys, args=args))
        reply = [int(x) for x in cast("list[Any]", reply)]
        if reply[0] == 1:
            held = tuple(f"{counters[p - 1]}:{buckets[p - 1].name}" for p in reply[1:])
            return Held(scope, held, want)
        _, p, m, used, limit = reply
        return Refused(scope, PERIODS[p - 1], METRICS[m - 1], used, limit, buckets[p - 1].ends_in)

    async def charge(self, scope: Scope, amounts: Amounts, now: float) -> tuple[str, ...]:
        """Add usage that already happened to the scope's current counters of every
        limited period: never refused (a counter may end above its limit). Returns the
        counters charged ("<counter key>:<bucket>")."""
        check_amounts(amounts)
        buckets = [bucket(p, now) for p in PERIODS]
        counters = [self._counter(scope, p) for p in PERIODS]
        keys = [self._key(scope, "conf"), *counters]
        args = [*amounts.as_tuple(), *(b.name for b in buckets)]
        reply = await self.store.run(lambda: self._charge(keys=keys, args=args))
        touched = [int(x) for x in cast("list[Any]", reply)]
        return tuple(f"{counters[p - 1]}:{buckets[p - 1].name}" for p in touched)

    async def settle(self, held: Held, actual: Amounts) -> None:
        """Replace what `held` reserved by what was actually used (0: a refund)."""
        await self.add(held.counters, actual.minus(held.amounts))

    async def add(self, counters: tuple[str, ...], delta: Amounts) -> None:
        """Add `delta` to counters of one scope (those a reservation touched)."""
        if not counters or delta == Amounts():
            return
        check_amounts(delta, signed=True)
        split = [counter.rsplit(":", 1) for counter in counters]
        keys = [key for key, _ in split]
        args = [*delta.as_tuple(), *(name for _, name in split)]
        await self.store.run(lambda: self._settle(keys=keys, args=args))

    async def usage(self, scope: Scope, now: float) -> dict[str, dict[str, int]]:
        """Used (and still reserved) amounts of the current bucket of each period."""
        client = self.store.client
        out: dict[str, dict[str, int]] = {}
        for period in PERIODS:
            counter = self._counter(scope, period)
            found = _text(await self.store.run(lambda c=counter: client.hgetall(c)))  # type: ignore[misc]
            if found.get("bucket") != bucket(period, now).name:
                found = {}  # a bucket that has closed
            out[period] = {m: int(found.get(m, "0")) for m in METRICS}
        return out
