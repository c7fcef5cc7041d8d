"""dlo.data.splits: the validation set is held out of the training split, deterministically; the test split is
never a validation set."""
from __future__ import annotations

import pytest
import torch

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo import data


def test_split_indices_are_disjoint_complete_and_seeded():
    train, val = data.split_indices(100, 10)
    assert len(val) == 10 and len(train) == 90
    assert sorted(train + val) == list(range(100)) and not set(train) & set(val)
    assert train == sorted(train) and val == sorted(val)
    assert data.split_indices(100, 10) == (train, val)  # the same split in every notebook, every run
    assert data.split_indices(100, 10, seed=1)[1] != val
    assert val != list(range(90, 100)) and val != list(range(10))  # a random draw, not the last or first images
    assert len(data.split_indices(1000)[1]) == round(1000 * data.DEFAULT_VAL_FRACTION)
    assert len(data.split_indices(50, 0.2)[1]) == 10


@pytest.mark.parametrize("n, val, message", [(100, 0, "between 1 and 99"), (100, 100, "between 1 and 99"),
                                             (100, 1.5, "fraction in \\(0, 1\\)"), (100, True, "number of images"),
                                             (1, 1, "integer >= 2")])
def test_split_indices_refuse_impossible_sizes_in_one_line(n, val, message):
    with pytest.raises(ValueError, match=message):
        data.split_indices(n, val)


class _Split(torch.utils.data.Dataset):
    def __init__(self, n, split="train", offset=0.0):
        self.targets = [i % 10 for i in range(n)]
        self.split, self.offset, self.source, self.is_generated = split, offset, "fake data", True

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return torch.tensor([float(i) + self.offset]), self.targets[i]


def test_holdout_takes_the_validation_part_from_the_evaluation_view():
    augmented, plain = _Split(40, offset=0.5), _Split(40)
    train_part, val_part = data.holdout(augmented, 8, eval_set=plain)
    train_idx, val_idx = data.split_indices(40, 8)
    assert train_part.indices == train_idx and val_part.indices == val_idx
    assert [val_part[k][0].item() for k in range(8)] == [float(i) for i in val_idx]  # no augmentation offset
    assert train_part[0][0].item() == train_idx[0] + 0.5
    assert val_part.targets == [i % 10 for i in val_idx] and val_part.part == "val"
    assert val_part.split == "train" and "validation part (8 images" in val_part.source


def test_holdout_refuses_the_test_split_and_mismatched_views():
    with pytest.raises(ValueError, match="held out of the TRAINING split"):
        data.holdout(_Split(40, split="test"), 8)
    with pytest.raises(ValueError, match="same training split opened twice"):
        data.holdout(_Split(40), 8, eval_set=_Split(30))


def test_cifar10_train_val_on_generated_data(tmp_path):
    data.make_generated_cifar10(tmp_path, 120, 20, seed=5)
    train_part, val_part = data.cifar10_train_val(20, tmp_path, data.train_transform(), data.test_transform(),
                                                  verbose=False)
    assert len(train_part) == 100 and len(val_part) == 20
    plain = data.cifar10("train", tmp_path, data.test_transform(), verbose=False)
    assert torch.equal(val_part[0][0], plain[val_part.indices[0]][0])


# --------------------------------------------------------------------------------------------------
# The notebooks that choose (a configuration, an epoch, an optimizer, a recipe) choose on validation images
# --------------------------------------------------------------------------------------------------

SELECTING = ["Jour2/augment.ipynb", "Jour3/optimizers.ipynb", "Jour3/recipes.ipynb", "Jour3/transfer.ipynb",
             "Jour4/hpo.ipynb"]


def _code(notebook):
    import json

    from dlo.runtime.paths import ROOT

    nb = json.loads((ROOT / notebook).read_text())
    return [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
            for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("notebook", SELECTING)
def test_choices_read_validation_images_and_the_test_split_once(notebook):
    import re

    cells = _code(notebook) + _lesson_code(notebook)
    code = "\n".join(cells)
    assert not re.search(r"val_loader\s*=\s*\w*test", code), "a test loader passed as the validation loader"
    assert "cifar10_train_val(" in code or "hpo.load_cifar_tensors(" in code
    reads_test = [c for c in cells if re.search(r"test_loader\w*\s*=|load_cifar_test_tensors\(", c)]
    assert len(reads_test) <= 1, "the test split is opened for the final report only"


def _lesson_code(notebook):
    """The notebook's lesson module (dlo.lessons.<name>), where its plumbing lives, as one more piece of its code."""
    from dlo.runtime.paths import ROOT

    module = ROOT / "lib" / "dlo" / "lessons" / (notebook.split("/")[-1].replace(".ipynb", ".py"))
    return [module.read_text()] if module.is_file() else []


def test_early_stopping_in_the_optimizers_notebook_watches_the_validation_loader():
    code = "\n".join(_code("Jour3/optimizers.ipynb"))
    lesson = "\n".join(_lesson_code("Jour3/optimizers.ipynb"))
    assert "res = train(model, make_loader, cfg, self.device, val_loader=self.val_loader)" in lesson
    assert "OptimizerRuns(S, train_set, val_loader, dev" in code  # the runs get the validation loader
    assert "early_stopping=2" in code and code.index("book.run") < code.index("early_stopping=2")
    assert code.index("early_stopping=2") < code.index("test_loader = ")  # the test set comes after every choice


def test_the_distillation_comparison_reads_validation_images():
    """Inference notebook: the temperatures are compared on validation curves; the test split scores each
    final model once (and the quantisation and pruning tables, which choose nothing, report test accuracy)."""
    code = "\n".join(_code("Jour4/inference.ipynb"))
    assert "data.split_indices(len(Xtr))" in code
    assert "eval_data=(Xval, Yval)" in code and "eval_data=(Xte" not in code
    assert "tested[name].append(infer.accuracy(student, Xte, Yte))" in code
