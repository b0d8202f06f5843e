"""Tell a Redis that is misaddressed from one that is down.

A Redis that does not answer is an outage the proxy outlives (it forwards without the
store and recovers when Redis returns). A Redis that answers but refuses how it is
addressed, a database number it does not have or credentials it rejects, will never
work: that is a setting to fix, and start-up says so instead of running without a store.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from redis.exceptions import AuthenticationError, RedisError

from proxy.store.redis import Store, StoreUnavailable


async def addressing_problem(store: Store, url: str) -> str | None:
    """Why this Redis refuses the URL, in words for a person; None when it answers or
    is merely unreachable."""
    try:
        await store.run(lambda: store.client.ping())
    except StoreUnavailable as error:
        cause = error.__cause__
        # A ResponseError over TCP; over a unix socket redis-py wraps it in ConnectionError.
        if isinstance(cause, RedisError) and "DB index is out of range" in str(cause):
            return (
                f"database {_database(url)} does not exist on that Redis (it answered"
                f" {str(cause)!r}; its `databases` setting bounds the number)"
            )
        if isinstance(cause, AuthenticationError):
            return f"that Redis refused the URL's credentials ({cause})"
    return None


def _database(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parse_qs(parts.query).get("db", ["0"])[-1]
    return parts.path.strip("/") or "0"
