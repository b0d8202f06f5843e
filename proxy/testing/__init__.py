"""The stand-in upstream: a local, strict imitation of the Anthropic Messages API.

Used by the tests, the benchmarks, and anyone who wants to try the proxy without an API
key (`compaction-proxy stand-in`). See standin.py.
"""

from proxy.testing.standin import (
    RECORDED,
    RecordedRequest,
    StandInOptions,
    create_app,
    run,
)

__all__ = ["RECORDED", "RecordedRequest", "StandInOptions", "create_app", "run"]
