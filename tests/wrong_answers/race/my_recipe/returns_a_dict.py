"""Returns the recipe's fields as a dict instead of a Recipe (no validation of the fields happens)."""
EXPECT = "must return a dlo.lessons.race.Recipe"


def my_recipe(base):
    fields = base.to_dict()
    fields.update(name="mine", epochs=4)
    return fields
