"""Correct: dataclasses.replace on the reference recipe, with more epochs at a lower learning rate under its own
name."""
import dataclasses


def my_recipe(base):
    return dataclasses.replace(base, name="mine: longer, gentler", epochs=base.epochs + 2, lr=base.lr * 0.5)
