"""Correct: Tensor methods, the mirror flipped on the width axis counted from the front (dimension 3 of N, C, H, W),
the two probabilities averaged as half their sum."""


def tta_predict(model, images):
    p = model(images).float().softmax(dim=1)
    q = model(images.flip(3)).float().softmax(dim=1)
    return 0.5 * (p + q)
