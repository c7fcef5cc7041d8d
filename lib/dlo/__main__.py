"""``python -m dlo COMMAND ...``: the same as the ``dlo`` console script."""
import sys

from dlo.cli import main

sys.exit(main())
