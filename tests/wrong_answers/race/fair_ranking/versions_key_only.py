"""Family: a flag set but the behaviour wrong. Takes a record with a versions field as recorded, without looking for
the torch version in it: a record whose versions lack torch is kept."""
EXPECT = "recorded without versions"


def fair_ranking(attempts, mine):
    fields = ("target", "data", "n_test", "hardware")
    if any(mine.get(k) is None for k in fields) or not (mine.get("versions") or {}).get("torch"):
        raise ValueError(f"{mine.get('name')!r} lacks target, data, n_test, hardware or versions")
    same = [a for a in attempts if a.get("versions") and all(a.get(k) == mine[k] for k in fields)]
    reached = sorted((a for a in same if a["reached"]), key=lambda a: a["time_to_target_s"])
    others = sorted((a for a in same if not a["reached"]), key=lambda a: -a["accuracy"])
    return [a["name"] for a in reached + others]
