"""Family: part of the result right. The gradients are right, but the returned loss is the last micro-batch's only."""
EXPECT = "last micro-batch"


def accumulated_backward(model, criterion, images, labels, k):
    for x, y in zip(images.chunk(k), labels.chunk(k)):
        loss = criterion(model(x), y)
        (loss * (len(x) / len(images))).backward()
    return loss.item()
