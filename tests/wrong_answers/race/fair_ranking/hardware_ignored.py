"""Compares the recipes whatever the GPU: a faster GPU wins a race the recipe did not."""
EXPECT = "other hardware"


def fair_ranking(attempts, mine):
    fields = ("target", "data", "n_test")
    if any(mine.get(k) is None for k in fields + ("hardware",)) or not (mine.get("versions") or {}).get("torch"):
        raise ValueError(f"{mine.get('name')!r} lacks target, data, n_test, hardware or versions")
    same = [a for a in attempts if all(a.get(k) == mine[k] for k in fields) and (a.get("versions") or {}).get("torch")]
    reached = sorted((a for a in same if a["reached"]), key=lambda a: a["time_to_target_s"])
    others = sorted((a for a in same if not a["reached"]), key=lambda a: -a["accuracy"])
    return [a["name"] for a in reached + others]
