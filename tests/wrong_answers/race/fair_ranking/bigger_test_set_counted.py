"""Family: inputs that never reach the mistake (every other test set was smaller). Keeps attempts evaluated on at
least as many test images as yours ("more images is only more precise"): a different test set is another
measurement, and the numbers are not comparable."""
EXPECT = "test images"


def fair_ranking(attempts, mine):
    fields = ("target", "data", "n_test", "hardware")
    if any(mine.get(k) is None for k in fields) or not (mine.get("versions") or {}).get("torch"):
        raise ValueError(f"{mine.get('name')!r} lacks target, data, n_test, hardware or versions")
    same = [a for a in attempts if all(a.get(k) is not None for k in fields) and (a.get("versions") or {}).get("torch")
            and a["n_test"] >= mine["n_test"] and all(a[k] == mine[k] for k in ("target", "data", "hardware"))]
    reached = sorted((a for a in same if a["reached"]), key=lambda a: a["time_to_target_s"])
    others = sorted((a for a in same if not a["reached"]), key=lambda a: -a["accuracy"])
    return [a["name"] for a in reached + others]
