"""gpuhost's pyinfra deploys (this checkout's deploy directory: `pyinfra INVENTORY deploys/X.py`).

Two settings of pyinfra's CLI that cost every run time, undone for the run of a deploy here:

- It turns Python's bytecode cache off for its whole process (pyinfra_cli/main.py, so that it
  writes no deploy.pyc): every run would then compile this package, facts/ and whatever of
  gpuhost has no cache yet again, about 30 modules and 20-40 ms a run. The deploy files are
  exec'd and never cached either way; the modules they import are, as Python does by default,
  unless the user asked for no cache (PYTHONDONTWRITEBYTECODE).
- It orders each operation by the file names and line numbers on its call stack
  (pyinfra.api.util.get_operation_order_from_stack), read with inspect.stack() and
  inspect.getframeinfo(), which also fetch a line of source for every frame: for each of ~20
  frames per operation a source lookup, and on the first a realpath() of every loaded module
  (inspect.getmodule's map): 30-80 ms of a converged run. pyinfra uses the names and numbers
  only, so its util module gets the same two calls without source context (context=0: the same
  frames, file names and line numbers; partial adds no frame of its own).
"""

import functools
import inspect
import os
import sys

from pyinfra.api import util as _pyinfra_util

if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
    sys.dont_write_bytecode = False

if getattr(_pyinfra_util, "stack", None) is inspect.stack:
    _pyinfra_util.stack = functools.partial(inspect.stack, 0)
if getattr(_pyinfra_util, "getframeinfo", None) is inspect.getframeinfo:
    _pyinfra_util.getframeinfo = functools.partial(inspect.getframeinfo, context=0)
