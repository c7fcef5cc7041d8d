"""Correct: permute to NHWC, make that contiguous, permute back: the shape is NCHW again and the memory is NHWC
(channels_last); the model's convolution weights converted one by one (the only 4-d tensors of a model)."""
import torch


def to_channels_last(model, images):
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.weight.data = module.weight.data.contiguous(memory_format=torch.channels_last)
    images = images.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    return model, images
