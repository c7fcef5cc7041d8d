"""Registers the hooks on every parameter of the model instead of self.params: a frozen one takes no hook."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
plan_buckets, Base = SOURCE["plan_buckets"], SOURCE["BucketedGradSync"]
EXPECT = ["frozen", "requires_grad=False"]


class BucketedGradSync(Base):
    def __init__(self, model, bucket_bytes):
        super().__init__(model, bucket_bytes)
        self.remove()
        for p in model.parameters():
            self.hook_handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
