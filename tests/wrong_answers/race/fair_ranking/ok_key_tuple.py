"""Correct: one comparability key per record, one sort with a tuple key (reached first, then time or -accuracy)."""


def fair_ranking(attempts, mine):
    fields = ["target", "data", "n_test", "hardware"]

    def key(record):
        if any(record.get(f) is None for f in fields) or not (record.get("versions") or {}).get("torch"):
            return None
        return tuple(record[f] for f in fields)

    if key(mine) is None:
        absent = [f for f in fields if mine.get(f) is None]
        if not (mine.get("versions") or {}).get("torch"):
            absent.append("versions")
        raise ValueError("cannot rank an attempt recorded without " + ", ".join(absent))
    group = [a for a in attempts if key(a) == key(mine)]
    group.sort(key=lambda a: (0, a["time_to_target_s"]) if a["reached"] else (1, -a["accuracy"]))
    return [a["name"] for a in group]
