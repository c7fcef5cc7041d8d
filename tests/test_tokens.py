"""dlo.data.tokens: local text (saved datasets.Dataset, .txt) with a locally built tokenizer, or generated tokens."""
from __future__ import annotations

import pytest
import torch

import dlo  # noqa: F401
from dlo.data import tokens

TEXT = "the cat sat on the mat . the dog sat on the log . " * 20


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([TEXT], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return path


def test_generated_stream_is_deterministic_and_learnable():
    a, b = tokens.generated_stream(2000, 64, seed=1), tokens.generated_stream(2000, 64, seed=1)
    assert torch.equal(a, b) and not torch.equal(a, tokens.generated_stream(2000, 64, seed=2))
    assert a.min() >= 0 and a.max() < 64
    follows = ((5 * a[:-1] + 1) % 64 == a[1:]).float().mean()
    assert follows > 0.8  # the rule holds 7/8 of the time: a model can learn it


def test_sequences_are_fixed_length_with_shifted_labels():
    ds, vocab = tokens.token_dataset(16, vocab_size=50, n_sequences=10)
    assert len(ds) == 10 and vocab == 50 and "generated" in ds.description
    ids, labels = ds[3]
    assert ids.shape == labels.shape == (16,)
    assert torch.equal(ids[1:], labels[:-1])
    assert torch.equal(ds.stream[48:65], torch.cat([ids, labels[-1:]]))


def test_text_file_and_saved_dataset(tmp_path, tokenizer_dir):
    import datasets

    (tmp_path / "a.txt").write_text(TEXT)
    ds_txt, vocab = tokens.token_dataset(8, source=tmp_path / "a.txt", tokenizer=tokenizer_dir)
    assert vocab == 10  # 8 words + [UNK] + [EOS]
    datasets.Dataset.from_dict({"text": [TEXT, "", TEXT]}).save_to_disk(tmp_path / "saved")
    ds_saved, _ = tokens.token_dataset(8, source=tmp_path / "saved", tokenizer=tokenizer_dir)
    assert len(ds_saved) > len(ds_txt)  # two documents
    ids, labels = ds_txt[0]
    assert ids.max() < vocab and torch.equal(ids[1:], labels[:-1])
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "x.txt").write_text(TEXT)
    assert len(tokens.token_dataset(8, source=folder, tokenizer=tokenizer_dir)[0]) == len(ds_txt)


def test_rank_loaders_split_the_single_process_batches():
    ds, _ = tokens.token_dataset(8, vocab_size=30, n_sequences=24)
    single = [ids for ids, _ in tokens.rank_loader(ds, 6, seed=3)]
    ranks = [[ids for ids, _ in tokens.rank_loader(ds, 6, r, 2, seed=3)] for r in (0, 1)]
    assert len(single) == len(ranks[0]) == 4 and ranks[0][0].shape == (3, 8)
    for step, batch in enumerate(single):
        got = torch.cat([ranks[0][step], ranks[1][step]])
        assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, batch.tolist()))


def test_clear_errors(tmp_path, tokenizer_dir):
    with pytest.raises(ValueError, match="not divisible by world size 4"):
        tokens.rank_loader(tokens.token_dataset(8, vocab_size=30)[0], 6, 0, 4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tokens.token_dataset(8, source=tmp_path / "missing.txt", tokenizer=tokenizer_dir)
    (tmp_path / "a.txt").write_text(TEXT)
    with pytest.raises(FileNotFoundError, match="tokenizer folder"):
        tokens.token_dataset(8, source=tmp_path / "a.txt", tokenizer=tmp_path / "no_tok")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        tokens.token_dataset(8, source=tmp_path / "a.txt")
    with pytest.raises(ValueError, match="vocabulary only 5"):
        tokens.token_dataset(8, source=tmp_path / "a.txt", tokenizer=tokenizer_dir, vocab_size=5)
