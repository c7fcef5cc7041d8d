"""Family: part of the result right. Returns the loss as a tensor that still holds the autograd graph of every
micro-batch (the memory accumulation is meant to save), not a float."""
EXPECT = "float"


def accumulated_backward(model, criterion, images, labels, k):
    total = 0
    for x, y in zip(images.chunk(k), labels.chunk(k)):
        loss = criterion(model(x), y) * (len(x) / len(images))
        loss.backward(retain_graph=True)
        total = total + loss
    return total
