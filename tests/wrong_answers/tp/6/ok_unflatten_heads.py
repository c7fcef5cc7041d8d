"""Correct, written another way: the heads split with unflatten / flatten instead of view / reshape, and the
divisibility checked by hand with its own ValueError."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives.py").items()
                  if not k.startswith("__")})
