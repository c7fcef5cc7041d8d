"""Worker for tests/test_agreed_timer.py: every rank times one call with dlo.parallel.agreed_timer.

``--fake``: each rank's own timer returns 1 + 2 * rank seconds (a slow last rank), so the agreed value is exact;
otherwise rank r's call sleeps 0.05 + 0.3 * r seconds. Each rank records its own time and the agreed one.
"""
import sys
import time

import dlo  # noqa: F401
from dlo.parallel import dp_events
from dlo.runtime import distributed, write_record

fake = "--fake" in sys.argv
with distributed(device="cpu", timeout_s=120) as ctx:
    own = {"value": None}
    if fake:
        def fake_timer(device=None):
            def timer(fn):
                fn()
                own["value"] = 1.0 + 2.0 * ctx.rank
                return own["value"]
            return timer
        dp_events.make_timer = fake_timer
    timer = dp_events.agreed_timer("cpu")
    calls = []

    def work():
        calls.append(1)
        if not fake:
            time.sleep(0.05 + 0.3 * ctx.rank)

    start = time.perf_counter()
    agreed = timer(work)
    if own["value"] is None:
        own["value"] = time.perf_counter() - start
    write_record({"agreed": agreed, "own": own["value"], "calls": len(calls)})
