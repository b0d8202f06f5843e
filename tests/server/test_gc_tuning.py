"""The serving process's collector (proxy/server/app.py tune_gc), in a process of its own
so the test run's collector is left as it is."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import gc
from proxy.server.app import GC_YOUNG_THRESHOLD, tune_gc
before = gc.get_threshold()
tune_gc()
after = gc.get_threshold()
assert gc.get_freeze_count() > 0, "what start() built is frozen"
assert after == (GC_YOUNG_THRESHOLD, before[1], before[2]), (before, after)
print("ok", after[0])
"""


def test_serve_freezes_what_start_built_and_collects_the_young_less_often() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "20000"]
