"""Layer 7, lessons: thin helpers of single notebooks (the race, HPO, inference, JIT, LR finder, DataLoader
profiling, MixUp/CutMix timing), built on the layers below.
"""
