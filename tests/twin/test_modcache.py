"""The stand-in module cache is shared by every process on the machine (test sessions, xdist
workers, a developer's twins): builds into one cold cache at once must all succeed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from twin import hwtesting as ht

SKIP = ht.missing_build_tools()

BUILD = """
import sys
from pathlib import Path
from twin.modbuild import ModuleCache
cache = ModuleCache(Path(sys.argv[1]))
for version in ("1.0", "1.1"):
    print(cache.ko("nvidia", "6.14.8-2-bpo12-pve", version=version, license="NVIDIA"))
"""


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_processes_building_into_one_cold_cache_at_once_all_succeed(tmp_path: Path) -> None:
    # Before the cache took a lock, one process's stamp_headers removed the headers tree the
    # other was compiling against ("No such file or directory: .../Makefile", or make failing).
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(tmp_path / "cache")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [err for _, err in outputs]
    kos = {line for out, _ in outputs for line in out.split()}
    assert len(kos) == 2 and all(Path(ko).stat().st_size > 0 for ko in kos)
