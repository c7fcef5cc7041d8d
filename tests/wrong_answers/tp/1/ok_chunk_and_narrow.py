"""Correct, written another way: the scatter's slice taken with chunk, the gather's backward slice with narrow, the
sums made contiguous first."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives_b.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives_b.py").items()
                  if not k.startswith("__")})
