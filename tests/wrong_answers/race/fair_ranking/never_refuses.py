"""Compares field by field with .get(): a record without its hardware is ranked (with the others that lack it) instead of refused."""
EXPECT = ["without its hardware", "refuse"]


def fair_ranking(attempts, mine):
    fields = ("target", "data", "n_test", "hardware")
    same = [a for a in attempts if all(a.get(k) == mine.get(k) for k in fields) and (a.get("versions") or {}).get("torch")]
    reached = sorted((a for a in same if a["reached"]), key=lambda a: a["time_to_target_s"])
    others = sorted((a for a in same if not a["reached"]), key=lambda a: -a["accuracy"])
    return [a["name"] for a in reached + others]
