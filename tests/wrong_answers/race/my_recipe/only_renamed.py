"""Gives the reference a new name and changes nothing else: the race would compare the reference with itself."""
EXPECT = "change at least one ingredient"


def my_recipe(base):
    return base.replace(name="mine")
