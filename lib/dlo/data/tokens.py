"""Token data for LLM training: a local text corpus tokenised with a local tokenizer, or a generated stream.

A causal language model learns to predict token ``t+1`` from tokens ``0..t``. Training data is therefore one
long stream of token ids cut into fixed-length windows: window ``i`` gives the inputs
``stream[i*S : i*S + S]`` and the labels ``stream[i*S + 1 : i*S + S + 1]`` (the same tokens shifted by one).
The labels are shifted *here*, once, so the training loop computes a plain cross-entropy between logits
and labels (do not also pass ``labels=`` to transformers' model: it would shift them a second time).

Where the stream comes from (:func:`token_dataset` says which one it used):

* ``source`` = a folder written by ``datasets.Dataset.save_to_disk`` (read with ``datasets.load_from_disk``),
  a ``.txt`` file, or a folder of ``.txt`` files; tokenised with ``tokenizer`` = a local folder that
  ``transformers.AutoTokenizer.from_pretrained`` can read (compute nodes have no hub access: paths only);
* no ``source``: a **deterministic generated stream** (:func:`generated_stream`) that a model can learn
  (each token mostly follows from the previous one), so the loss goes down in a few steps and two runs on
  the same seed see exactly the same data.

:func:`rank_loader` gives each rank its slice of every global batch (a ``DistributedSampler``): the union of
the ranks' step-``k`` batches is exactly the single-process step-``k`` batch, which is what lets the tests
compare a 2-process run with a 1-process run step by step.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dlo.runtime.validate import positive_int as _positive
from dlo.runtime.validate import per_rank_batch

__all__ = ["generated_stream", "load_texts", "tokenize_texts", "TokenSequences", "token_dataset", "per_rank_batch",
           "rank_loader"]


def generated_stream(n_tokens: int, vocab_size: int, *, seed: int = 0) -> torch.Tensor:
    """``n_tokens`` token ids in ``[0, vocab_size)``, the same for the same seed, and learnable.

    Each token is ``(5 * previous + 1) mod vocab`` with probability 7/8, a random token otherwise: a model
    that learns the rule reaches a loss far below ``log(vocab)``, and the random 1/8 keeps it from being trivial.
    """
    _positive("n_tokens", n_tokens)
    _positive("vocab_size", vocab_size)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randint(0, vocab_size, (n_tokens,), generator=gen)
    keep = torch.rand(n_tokens, generator=gen) < 7 / 8
    out = torch.empty(n_tokens, dtype=torch.long)
    out[0] = noise[0]
    rule = (5 * torch.arange(vocab_size) + 1) % vocab_size
    for i in range(1, n_tokens):  # a Python loop is fine at the sizes of a course (~1e5 tokens/s)
        out[i] = rule[out[i - 1]] if keep[i] else noise[i]
    return out


def load_texts(source: str | os.PathLike, *, text_column: str = "text") -> list[str]:
    """The documents of ``source``: a ``save_to_disk`` dataset folder, a ``.txt`` file, or a folder of ``.txt`` files."""
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"text data {source} does not exist: give a datasets.save_to_disk folder, a .txt "
                                "file or a folder of .txt files (or no source for generated tokens)")
    if path.is_file():
        return [path.read_text(encoding="utf-8")]
    if (path / "dataset_info.json").is_file() or (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        import datasets

        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise ValueError(f"{source} holds splits {list(ds)} but no 'train' split: save the training split")
            ds = ds["train"]
        if text_column not in ds.column_names:
            raise ValueError(f"{source} has columns {ds.column_names}, not {text_column!r}: pass text_column=...")
        return [t for t in ds[text_column] if t]
    files = sorted(path.glob("*.txt"))
    if not files:
        raise ValueError(f"{source} is a folder with neither a saved dataset (dataset_info.json) nor .txt files")
    return [f.read_text(encoding="utf-8") for f in files]


def tokenize_texts(texts: list[str], tokenizer: str | os.PathLike | Any) -> tuple[torch.Tensor, int]:
    """One stream of ids (documents joined by the EOS token when there is one) and the vocabulary size.

    ``tokenizer``: a local folder for ``AutoTokenizer.from_pretrained`` (never a hub name: no internet on
    compute nodes) or an already loaded tokenizer."""
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer folder {tokenizer} does not exist: give a local folder saved with "
                                    "tokenizer.save_pretrained (compute nodes cannot download from the hub)")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(int(eos))
    return torch.tensor(ids, dtype=torch.long), len(tokenizer)


class TokenSequences(Dataset):
    """Fixed-length windows of a token stream: item ``i`` is ``(input_ids, labels)``, labels shifted by one.

    Windows do not overlap; the last incomplete one is dropped (it would need padding)."""

    def __init__(self, stream: torch.Tensor, seq_len: int, *, description: str = "") -> None:
        _positive("seq_len", seq_len)
        if stream.dim() != 1:
            raise ValueError(f"the token stream must be 1-D, got shape {tuple(stream.shape)}")
        self.n = (stream.numel() - 1) // seq_len
        if self.n < 1:
            raise ValueError(f"{stream.numel()} tokens cannot fill one sequence of {seq_len} + 1 tokens: "
                             "use more text or a shorter seq_len")
        self.stream, self.seq_len, self.description = stream, seq_len, description

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        start = i * self.seq_len
        window = self.stream[start:start + self.seq_len + 1]
        return window[:-1], window[1:]


def token_dataset(seq_len: int, *, source: str | os.PathLike | None = None, tokenizer: Any = None,
                  vocab_size: int | None = None, n_sequences: int = 256, seed: int = 0,
                  text_column: str = "text") -> tuple[TokenSequences, int]:
    """``(dataset, vocab_size)``: the tokenised ``source`` if given, else a generated stream of ``n_sequences``.

    A ``source`` needs a ``tokenizer``; generated data needs ``vocab_size``. The dataset's ``description``
    says which data it is (print it: a run should never hide that it trained on generated tokens)."""
    _positive("seq_len", seq_len)
    if source is not None:
        if tokenizer is None:
            raise ValueError("text data needs a tokenizer: pass tokenizer=<local folder> (AutoTokenizer.from_pretrained)")
        stream, vocab = tokenize_texts(load_texts(source, text_column=text_column), tokenizer)
        if vocab_size is not None and vocab > vocab_size:
            raise ValueError(f"the tokenizer has {vocab} tokens but the model's vocabulary only {vocab_size}: "
                             "use a model config with a vocabulary at least that large")
        ds = TokenSequences(stream, seq_len, description=f"{source} tokenised with {tokenizer}: {stream.numel():,} tokens")
        return ds, vocab
    if tokenizer is not None:
        raise ValueError("a tokenizer without text data: pass source=<dataset folder or .txt>, or neither")
    if vocab_size is None:
        raise ValueError("generated tokens need vocab_size")
    _positive("n_sequences", n_sequences)
    stream = generated_stream(n_sequences * seq_len + 1, vocab_size, seed=seed)
    return TokenSequences(stream, seq_len, description=f"generated token stream (seed {seed}, vocab {vocab_size}, "
                                                       f"{n_sequences} sequences of {seq_len})"), vocab_size


def rank_loader(dataset: Dataset, global_batch: int, rank: int = 0, world_size: int = 1, *, shuffle: bool = True,
                seed: int = 0, epoch: int = 0) -> DataLoader:
    """This rank's loader: ``global_batch / world_size`` sequences per step, from a ``DistributedSampler``.

    Every rank draws the same permutation (same seed and epoch) and takes every ``world_size``-th index: at
    each step the ranks' batches are disjoint and together form the single-process batch of that step."""
    batch = per_rank_batch(global_batch, world_size)
    if len(dataset) < global_batch:
        raise ValueError(f"{len(dataset)} sequences cannot fill one global batch of {global_batch}: "
                         "use more data or a smaller batch")
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)
