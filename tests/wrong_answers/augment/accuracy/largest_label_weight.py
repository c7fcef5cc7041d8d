"""Scores the largest weight of each label, whatever the model predicted."""


EXPECT = "whatever the model predicted"


def mixed_accuracy(logits, targets):
    pred = logits.argmax(dim=1)
    if targets.ndim == 1:
        return (pred == targets).float().mean().item()
    return targets.max(dim=1).values.mean().item()
