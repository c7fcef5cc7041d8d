"""Correct: the missing fields of the new attempt listed first, the comparable attempts kept by a loop, the ranking
built from two sorted lists."""


def fair_ranking(attempts, mine):
    needed = ("target", "data", "n_test", "hardware")

    def missing(record):
        out = [k for k in needed if record.get(k) is None]
        torch_version = (record.get("versions") or {}).get("torch")
        return out + ([] if torch_version else ["versions"])

    absent = missing(mine)
    if absent:
        raise ValueError(f"the attempt {mine.get('name')!r} lacks {', '.join(absent)}: cannot be compared")
    comparable = []
    for record in attempts:
        if missing(record):
            continue
        if all(record[k] == mine[k] for k in needed):
            comparable.append(record)
    fast = sorted([a for a in comparable if a["reached"]], key=lambda a: a["time_to_target_s"])
    slow = sorted([a for a in comparable if not a["reached"]], key=lambda a: a["accuracy"], reverse=True)
    return [a["name"] for a in fast] + [a["name"] for a in slow]
