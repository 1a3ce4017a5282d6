"""The killed remote build: `gpuhost build` against a build host (this machine behind its own
sshd, tests/build/sshd.py, with the compiler wrapper first on its sessions' PATH, logging every
call), into a new store there; the first client is killed mid-build (its SSH connection gone),
the build runs on there to its end, and a second `gpuhost build` waits for it.

One real build serves two ends: on a machine whose test kernel cache is cold, this scenario is
how the cache is filled (tests/build/kernel_cache.py keeps its record for the test run), and
tests/build/test_build_host.py checks what it saw; with the cache warm, test_build_host runs it
itself. Either way each test run makes one real build over SSH and checks it, and a clean
machine builds the kernel once, not twice (once for the cache, once over SSH).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.build.sshd import LocalBuildHost, local_build_host

GPUHOST = Path(sys.executable).parent / "gpuhost"
RECORD = "killed-build.json"
DRIVER = "595.71.05"


@dataclass(frozen=True)
class KilledBuild:
    store: Path  # the build host's store, new before the build
    work: Path  # the --work directory both runs made their scratch directories in
    cc_log: Path  # every compiler call on the build host while both ran
    killed_with_debs: list[str]  # the .debs in the store when the first client was killed
    returncode: int  # of the second `gpuhost build`, the one that waited
    stdout: str
    stderr: str
    seconds: float  # from the first run's start to the second's end
    error: str = ""  # why the scenario stopped early ("" when it ran through)

    def calls(self) -> list[str]:
        """The compiler calls (its --version probes left out)."""
        return cc_calls(self.cc_log)


def cc_calls(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.is_file() else []
    return [line for line in lines if "--version" not in line]


def compiled(calls: list[str], output: str) -> int:
    """How many of ``calls`` wrote ``output`` (``-o <output>``, relative to the object tree)."""
    return sum(1 for line in calls if f" -o {output} " in f" {line} ")


def inventory(path: Path, builder: LocalBuildHost, store: Path, cache: Path | None = None) -> Path:
    """An inventory whose host `kb` builds the test kernel on ``builder`` into ``store``."""
    from tests.build.kernel_cache import source_tree, spec  # kernel_cache imports this module

    host = {**spec(source_tree(cache), store), "driver": {"version": DRIVER}}
    host["artifacts"] = {"store": str(store), "build_host": "builder"}
    path.write_text(
        "from gpuhost.spec.inventory import build_host, gpu_host\n"
        f"{builder.entry('builder')}\n"
        f"gpu_hosts = [gpu_host('kb', ssh_hostname='192.0.2.1', spec={host!r})]\n"
    )
    return path


def gpuhost_build(inv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(GPUHOST), "build", str(inv), *args], capture_output=True, text=True, timeout=3600
    )


def run(where: Path, wrappers: Path, cache: Path | None = None) -> KilledBuild:
    """The scenario in ``where`` (new or empty): a build host whose PATH starts with
    ``wrappers`` (kernel_cache.wrapper_dir), its store ``where/store``. The record is also
    written to ``where/killed-build.json``; an exception is recorded as ``error``."""
    store, work, log = where / "store", where / "work", where / "cc.log"
    work.mkdir(parents=True)
    started = time.monotonic()
    killed: list[str] = []
    again = subprocess.CompletedProcess([], -1, "", "")
    error = ""
    try:
        with local_build_host(where / "ssh", [wrappers], {"GPUHOST_TEST_CC_LOG": str(log)}) as bh:
            inv = inventory(where / "inv.py", bh, store, cache)
            first = subprocess.Popen(
                [str(GPUHOST), "build", str(inv), "--work", str(work)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 600
            while len(cc_calls(log)) < 20:  # it compiles there
                if first.poll() is not None or time.monotonic() > deadline:
                    out, err = first.communicate(timeout=60)
                    raise RuntimeError(
                        f"the first `gpuhost build` did not get to compile: {out}{err}"
                    )
                time.sleep(0.5)
            first.kill()
            first.communicate()
            killed = sorted(p.name for p in store.rglob("*.deb"))
            again = gpuhost_build(inv, "--work", str(work))
    except Exception as exc:  # kept for the test that checks the scenario to report
        error = f"{type(exc).__name__}: {exc}"
    done = KilledBuild(
        store, work, log, killed, again.returncode, again.stdout, again.stderr,
        round(time.monotonic() - started, 1), error,
    )  # fmt: skip
    record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(done).items()}
    (where / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return done


def load(where: Path) -> KilledBuild | None:
    """The scenario recorded in ``where`` by :func:`run`, None when there is none."""
    path = where / RECORD
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    for name in ("store", "work", "cc_log"):
        record[name] = Path(record[name])
    return KilledBuild(**record)
