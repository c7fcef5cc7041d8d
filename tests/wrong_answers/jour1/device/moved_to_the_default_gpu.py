"""Flag right, behaviour wrong: non_blocking is set, but the device is chosen again inside the function instead of
using the one given (a checker that only tries the CPU never sees it)."""
import torch

EXPECT = 'given device'


def to_device(images, labels, device):
    target = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return images.to(target, non_blocking=True), labels.to(target, non_blocking=True)
