"""Correct, written another way: the product of the two branches written the other way round, f applied once at
the top of forward, the layers built in another order."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives.py").items()
                  if not k.startswith("__")})
