"""Correct, written another way: the groups filled by integer division of the ranks, this rank's group picked by index."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives_b.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives_b.py").items()
                  if not k.startswith("__")})
