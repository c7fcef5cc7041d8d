"""Family: sizes that coincide. Weights each micro-batch by 1 / k when the pieces have equal sizes, by its share of
the samples otherwise: where images.chunk(k) gives fewer than k equal pieces (10 samples, k=6 gives 5 pieces of 2)
the gradient is 5/6 of the big batch's."""

EXPECT = "big batch's"


def accumulated_backward(model, criterion, images, labels, k):
    pieces = list(zip(images.chunk(k), labels.chunk(k)))
    equal = len({len(x) for x, _ in pieces}) == 1
    total = 0.0
    for x, y in pieces:
        loss = criterion(model(x), y) * (1 / k if equal else len(x) / len(images))
        loss.backward()
        total += loss.item()
    return total
