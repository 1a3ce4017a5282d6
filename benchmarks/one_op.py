"""The yardstick for benchmarks/rerun.py: a deploy of one stock pyinfra operation."""

from pyinfra.operations import files

files.file(name="One file", path="/etc/hostname", present=True)
