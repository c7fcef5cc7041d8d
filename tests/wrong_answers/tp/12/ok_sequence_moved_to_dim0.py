"""Correct, written another way: the sequence moved to dim 0 by a transpose, gathered and reduce-scattered along it,
moved back."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives_b.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives_b.py").items()
                  if not k.startswith("__")})
