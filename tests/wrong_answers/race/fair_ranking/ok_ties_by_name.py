"""Correct: the comparable attempts kept by a key function, ties broken by name (any order among ties is right)."""


def fair_ranking(attempts, mine):
    fields = ("target", "data", "n_test", "hardware")

    def comparable_key(a):
        if any(a.get(k) is None for k in fields) or not (a.get("versions") or {}).get("torch"):
            return None
        return tuple(a[k] for k in fields)

    if comparable_key(mine) is None:
        raise ValueError("cannot compare: the attempt lacks one of " + ", ".join(fields) + " or versions")
    group = [a for a in attempts if comparable_key(a) == comparable_key(mine)]
    ranked = sorted(group, key=lambda a: (not a["reached"], a["time_to_target_s"] if a["reached"] else -a["accuracy"],
                                          a["name"]))
    return [a["name"] for a in ranked]
