"""Family: inputs that never reach the mistake. Returns the plain mean of the micro-batches' mean losses: right only
when every micro-batch has the same size (k=3 of 30 images), not the whole batch's mean when they differ."""
EXPECT = "mean of the micro-batches' mean losses"


def accumulated_backward(model, criterion, images, labels, k):
    losses = []
    for x, y in zip(images.chunk(k), labels.chunk(k)):
        loss = criterion(model(x), y)
        (loss * (len(x) / len(images))).backward()
        losses.append(loss.item())
    return sum(losses) / len(losses)
