"""Correct, written another way: the gradients flattened with torch's dense-tensor helpers and averaged as a product;
the metric's two sums in one float64 tensor."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives_b.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives_b.py").items()
                  if not k.startswith("__")})
