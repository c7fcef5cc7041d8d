"""Correct, written another way: the sum of exponentials and the target logit reduced in two calls instead of one
stacked call, the target picked with a one-hot mask, float64 on the way."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives.py").items()
                  if not k.startswith("__")})
