"""Layer 8, course tooling: the notebook runner, the student-copy generator, the nbval plugin and the exercise
checkers. Nothing below imports it.
"""
