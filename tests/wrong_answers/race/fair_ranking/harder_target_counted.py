"""Family: inputs that never reach the mistake (every other target was lower). Keeps attempts whose target is at
least yours ("a harder target reached is mine reached too"): their time is to another target, another race."""
EXPECT = "its target is"


def fair_ranking(attempts, mine):
    fields = ("target", "data", "n_test", "hardware")
    if any(mine.get(k) is None for k in fields) or not (mine.get("versions") or {}).get("torch"):
        raise ValueError(f"{mine.get('name')!r} lacks target, data, n_test, hardware or versions")
    same = [a for a in attempts if all(a.get(k) is not None for k in fields) and (a.get("versions") or {}).get("torch")
            and a["target"] >= mine["target"] and all(a[k] == mine[k] for k in ("data", "n_test", "hardware"))]
    reached = sorted((a for a in same if a["reached"]), key=lambda a: a["time_to_target_s"])
    others = sorted((a for a in same if not a["reached"]), key=lambda a: -a["accuracy"])
    return [a["name"] for a in reached + others]
