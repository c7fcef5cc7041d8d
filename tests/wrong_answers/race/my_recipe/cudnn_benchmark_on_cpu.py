"""Turns cudnn.benchmark on for the smoke race, which runs on a CPU: there is no cuDNN to tune."""
EXPECT = "cudnn_benchmark"


def my_recipe(base):
    return base.replace(name="mine: benchmark", cudnn_benchmark=True)
