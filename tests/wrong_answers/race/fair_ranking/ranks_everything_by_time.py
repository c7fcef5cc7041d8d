"""The naive leaderboard: every attempt that reached the target, sorted by time, whatever it ran on."""
EXPECT = "cannot be ranked with yours"


def fair_ranking(attempts, mine):
    reached = sorted((a for a in attempts if a.get("reached")), key=lambda a: a["time_to_target_s"])
    others = sorted((a for a in attempts if not a.get("reached")), key=lambda a: -a["accuracy"])
    return [a["name"] for a in reached + others]
