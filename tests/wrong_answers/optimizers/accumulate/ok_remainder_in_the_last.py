"""Correct: k micro-batches of len(images) // k samples, the remainder added to the last one, each loss weighted by
its share of the samples: another partition than chunk's, the same gradient."""


def accumulated_backward(model, criterion, images, labels, k):
    n, size = len(images), len(images) // k
    total = 0.0
    for i in range(k):
        stop = n if i == k - 1 else (i + 1) * size
        x, y = images[i * size:stop], labels[i * size:stop]
        loss = criterion(model(x), y) * (len(x) / n)
        loss.backward()
        total += loss.item()
    return total
