"""Family: parameters without a gradient. Sums the losses weighted by len(x), then divides every parameter's .grad
by len(images) after the loop: right when every parameter gets a gradient, but a frozen layer's .grad is None."""

EXPECT = "it raised"


def accumulated_backward(model, criterion, images, labels, k):
    total = 0.0
    for x, y in zip(images.chunk(k), labels.chunk(k)):
        loss = criterion(model(x), y) * len(x)
        loss.backward()
        total += loss.item()
    for p in model.parameters():
        p.grad /= len(images)
    return total / len(images)
