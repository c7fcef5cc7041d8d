"""Family: inputs that never reach the mistake. Reads each attempt's fields with a["..."]: a record that lacks one
of them (an older file) stops the whole ranking with a KeyError instead of being left out."""
EXPECT = "KeyError"


def fair_ranking(attempts, mine):
    fields = ("target", "data", "n_test", "hardware")
    if any(mine.get(k) is None for k in fields) or not (mine.get("versions") or {}).get("torch"):
        raise ValueError(f"{mine.get('name')!r} lacks target, data, n_test, hardware or versions")
    same = [a for a in attempts if all(a[k] == mine[k] for k in fields) and (a.get("versions") or {}).get("torch")]
    reached = sorted((a for a in same if a["reached"]), key=lambda a: a["time_to_target_s"])
    others = sorted((a for a in same if not a["reached"]), key=lambda a: -a["accuracy"])
    return [a["name"] for a in reached + others]
