"""Correct, written another way: the columns taken with split, the bias added with torch.add after the sum."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives_b.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives_b.py").items()
                  if not k.startswith("__")})
