"""Turns torch.compile on for the smoke race on a CPU: compilation alone would take longer than the race."""
EXPECT = "compile=False"


def my_recipe(base):
    return base.replace(name="mine: compiled", compile=True)
