"""Family: part of the result right. Splits into micro-batches of k images (split(k)) instead of k micro-batches:
weighted by size, the gradient is still right, but the model runs on many small batches."""
EXPECT = "micro-batches"


def accumulated_backward(model, criterion, images, labels, k):
    total = 0.0
    for x, y in zip(images.split(k), labels.split(k)):
        loss = criterion(model(x), y) * (len(x) / len(images))
        loss.backward()
        total += loss.item()
    return total
