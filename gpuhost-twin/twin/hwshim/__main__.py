"""python3 -m hwshim TOOL ARGS... (inside the twin; python -m twin.hwshim outside)."""

import sys

from . import main

sys.exit(main(sys.argv[1], sys.argv[2:]))
