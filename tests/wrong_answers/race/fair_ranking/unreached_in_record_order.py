"""Sorts by time only: the attempts that never reached the target stay in the file's order, not by test accuracy."""
import math

EXPECT = "by test accuracy"


def fair_ranking(attempts, mine):
    fields = ("target", "data", "n_test", "hardware")
    if any(mine.get(k) is None for k in fields) or not (mine.get("versions") or {}).get("torch"):
        raise ValueError(f"{mine.get('name')!r} lacks target, data, n_test, hardware or versions")
    same = [a for a in attempts if all(a.get(k) == mine[k] for k in fields) and (a.get("versions") or {}).get("torch")]
    ranked = sorted(same, key=lambda a: a["time_to_target_s"] if a["reached"] else math.inf)
    return [a["name"] for a in ranked]
