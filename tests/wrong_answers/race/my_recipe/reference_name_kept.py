"""Changes an ingredient but keeps the reference's name: the leaderboard could not tell the two apart."""
EXPECT = "its own name"


def my_recipe(base):
    return base.replace(batch_size=base.batch_size // 2)
