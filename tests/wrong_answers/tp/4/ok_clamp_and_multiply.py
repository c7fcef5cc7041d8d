"""Correct, written another way: the out-of-range ids are clamped into the local table and their rows multiplied by
a 0/1 mask instead of masked_fill."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives.py").items()
                  if not k.startswith("__")})
