"""no_sync() turns synchronisation back on after the yield without try/finally: an exception inside the block
leaves it off, and every later step silently trains each rank alone."""
import contextlib

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
train_step_accumulated = SOURCE["train_step_accumulated"]
EXPECT = "try/finally"


class GradSync(SOURCE["GradSync"]):
    @contextlib.contextmanager
    def no_sync(self):
        self.require_sync = False
        yield
        self.require_sync = True
