"""``python -m mrtpo.warm_start``: the same as ``mrtpo sft``."""

import sys

from mrtpo.warm_start.cli import main

sys.exit(main())
