"""``python -m mrtpo.evaluate``: the same as ``mrtpo eval``."""

import sys

from mrtpo.evaluate import main

sys.exit(main(sys.argv[1:]))
