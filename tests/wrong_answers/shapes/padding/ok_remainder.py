"""Correct: adds what is missing to the next multiple, using the remainder."""


def pad_to_multiple(n, k):
    remainder = n % k
    return n if remainder == 0 else n + (k - remainder)
