"""Family: a flag set but the behaviour wrong. Runs the whole batch in one forward and backward: the gradient and
the loss are right, but nothing is split, so the memory of the activations is that of the big batch."""
EXPECT = "micro-batches"


def accumulated_backward(model, criterion, images, labels, k):
    loss = criterion(model(images), labels)
    loss.backward()
    return loss.item()
