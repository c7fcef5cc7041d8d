"""Correct, written another way: the blocks appended in a loop, the head tied by sharing the Parameter object, the
rotary tables built once per call from the config."""
from pathlib import Path

from dlo.course.exercises import load_exercises

# the alternative is written in ../_alternatives.py, with those of the other balises (one check run for all)
globals().update({k: v for k, v in load_exercises(Path(__file__).parents[1] / "_alternatives.py").items()
                  if not k.startswith("__")})
