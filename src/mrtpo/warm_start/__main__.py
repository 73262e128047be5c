"""``python -m mrtpo.warm_start``: the same as ``mrtpo sft``."""

import sys

from mrtpo.warm_start import main

sys.exit(main())
