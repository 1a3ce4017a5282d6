"""gpuhost's pyinfra deploys (this checkout's deploy directory: `pyinfra INVENTORY deploys/X.py`).

pyinfra's CLI turns Python's bytecode cache off for its whole process (pyinfra_cli/main.py, so
that it writes no deploy.pyc): every run would then compile this package, facts/ and whatever
of gpuhost has no cache yet again, about 30 modules and 20-40 ms a run. The deploy files are
exec'd and never cached either way; the modules they import are, as Python does by default,
unless the user asked for no cache (PYTHONDONTWRITEBYTECODE).
"""

import os
import sys

if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
    sys.dont_write_bytecode = False
