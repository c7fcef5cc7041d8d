"""Correct, written another way: f's forward returns a clone instead of a view, and the gather's backward picks this
rank's slice with chunk instead of split_last_dim."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives.py").items()
                  if not k.startswith("__")})
