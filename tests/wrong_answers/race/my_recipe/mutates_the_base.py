"""Family: a flag set but the behaviour wrong. Sets the fields on the base recipe itself and returns it: the
reference recipe is changed too, and the race would compare the recipe with itself."""
EXPECT = "changed the base recipe"


def my_recipe(base):
    base.name = "mine: 4 epochs"
    base.epochs = 4
    return base
