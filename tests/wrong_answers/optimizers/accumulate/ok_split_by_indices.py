"""Correct: the micro-batches cut with tensor_split over the same boundaries as chunk, each loss weighted by its share
of the samples, the running total kept as a float."""


def accumulated_backward(model, criterion, images, labels, k):
    n = len(images)
    sizes = [len(c) for c in images.chunk(k)]
    bounds, start = [], 0
    for size in sizes[:-1]:
        start += size
        bounds.append(start)
    total = 0.0
    for x, y in zip(images.tensor_split(bounds), labels.tensor_split(bounds)):
        loss = criterion(model(x), y) * x.shape[0] / n
        loss.backward()
        total += loss.item()
    return total
