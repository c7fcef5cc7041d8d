"""Family: inputs that never reach the mistake (only the smoke base is tried). Starts from the smoke recipe whatever
base it is given: in the full race on a GPU the recipe would be the smoke one (width 4, fp32, on a CPU's
settings)."""
from dlo.lessons import race

EXPECT = "ignores its base"


def my_recipe(base):
    return race.smoke_recipe().replace(name="mine: batch 32", batch_size=32)
