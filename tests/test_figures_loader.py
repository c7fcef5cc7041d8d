"""The DataLoader pipeline picture is drawn from the loader's own settings: as many workers as num_workers,
prefetch_factor queue slots per worker, pinned or ordinary host memory and the matching copy."""
from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from dlo import data  # noqa: E402
from dlo.lessons.figures.loader import input_pipeline, pipeline_settings  # noqa: E402
from dlo.lessons.figures.style import drawn  # noqa: E402


def _tags(fig, kind):
    return [d["tag"] for d in drawn(fig, "box") if isinstance(d["tag"], tuple) and d["tag"][0] == kind]


@pytest.mark.parametrize("workers, prefetch, pinned", [(0, None, False), (1, 1, False), (2, None, True), (4, 3, True)])
def test_the_drawn_workers_and_queue_slots_are_the_loaders(workers, prefetch, pinned):
    loader = data.make_loader(list(range(16)), 4, num_workers=workers, prefetch_factor=prefetch, pin_memory=pinned)
    fig = input_pipeline(loader)
    expected_pf = (prefetch or 2) if workers else 0
    assert pipeline_settings(loader) == {"num_workers": workers, "prefetch_factor": expected_pf, "pin_memory": pinned}
    assert [t[1] for t in _tags(fig, "worker")] == list(range(workers))
    slots = _tags(fig, "slot")
    assert len(slots) == workers * expected_pf
    assert sorted(slots) == sorted(("slot", i, j) for i in range(workers) for j in range(expected_pf))
    assert _tags(fig, "host") == [("host", "pinned" if pinned else "pageable")]
    copies = [d["tag"] for d in drawn(fig, "arrow") if isinstance(d["tag"], tuple) and d["tag"][0] == "copy"]
    assert copies == [("copy", "non_blocking" if pinned else "blocking")]
    assert _tags(fig, "step") and (workers or _tags(fig, "loader"))
    matplotlib.pyplot.close(fig)


def test_settings_from_a_mapping_and_a_png(tmp_path):
    fig = input_pipeline({"num_workers": 3, "prefetch_factor": 4, "pin_memory": False}, path=tmp_path / "p.png")
    assert len(_tags(fig, "slot")) == 12 and (tmp_path / "p.png").stat().st_size > 0
    matplotlib.pyplot.close(fig)
