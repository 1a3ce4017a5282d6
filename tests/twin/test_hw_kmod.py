"""The twin's modprobe decides as real kmod does: which install line and which softdep line count,
and when a module's install command runs at all. Each case is put to this machine's real kmod
(`modprobe -d <tree> -S <kernel> -C <config dir> --show-depends`, over a module tree of real
.ko files that real depmod indexed) and to the twin (hwsim's probe_plan over the same files):
both must say "install" (the command runs) or "insmod" (the module is inserted, no command).

The gpuhost vfio claim is one of the cases: with a module that declares a softdep kmod can
resolve, an install line alone is ignored (the claim would not run), and gpuhost's
gpuhost-vfio.conf (gpuhost/plan/guests/vfio.py) makes it run.

Each case is put to two real kmods: this machine's (Debian 12's kmod 30, PVE 8) and Debian 13's
(kmod 34, PVE 9), run chrooted into the twin's trixie base over the same tree.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhost.build.driver import kmod_tool
from gpuhost.plan.guests.vfio import VfioBinding, modprobe_conf
from twin import hwsim
from twin import hwtesting as ht
from twin.modbuild import in_sysroot

KVER = "6.8.12-9-pve"
DEPMOD, MODPROBE = kmod_tool("depmod"), kmod_tool("modprobe")  # in /usr/sbin, for any user
SKIP = ht.missing_build_tools() or (
    None if DEPMOD and MODPROBE else "needs kmod's depmod and modprobe (Debian package kmod)"
)
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

OLD_CLAIM = "install nvidia /bin/echo claimed && /sbin/modprobe --ignore-install nvidia\n"
CLAIM = modprobe_conf(VfioBinding(("0000:c1:00.0",), ("nvidia",)))


@pytest.fixture(scope="module")
def cache() -> ht.ModuleCache:
    return ht.ModuleCache()


def kmod_argv(base: Path | None, root: Path, tool: str, *args: str) -> list[str]:
    """tool (depmod, modprobe) over the tree at root: here, or in base with the tree on /mnt."""
    if base is None:
        return [DEPMOD if tool == "depmod" else MODPROBE, *(a.format(root=root) for a in args)]
    return in_sysroot(base, root, [f"/usr/sbin/{tool}", *(a.format(root="/mnt") for a in args)])


def tree(
    tmp: Path, cache: ht.ModuleCache, nvidia_softdep: str | None, base: Path | None = None
) -> Path:
    """A twin root whose kernel module tree holds nvidia (with this MODULE_SOFTDEP; None: the
    real module's) and the crypto modules it names, indexed by real depmod."""
    root = ht.make_root(tmp / "root", "kpro6")
    extra = root / "lib/modules" / KVER / "extra"
    extra.mkdir(parents=True, exist_ok=True)
    shutil.copy(cache.ko("nvidia", KVER, softdep=nvidia_softdep), extra / "nvidia.ko")
    for name in ("ecdh_generic", "ecdsa_generic"):
        shutil.copy(cache.ko(name, KVER, softdep=""), extra / f"{name}.ko")
    argv = kmod_argv(base, root, "depmod", "-b", "{root}", KVER)
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return root


def real_kmod(root: Path, confs: dict[str, str], base: Path | None = None) -> list[str]:
    """kmod's --show-depends for nvidia: one "install"/"insmod" per module it would handle."""
    conf = root / "etc/modprobe.d"
    conf.mkdir(parents=True, exist_ok=True)
    for f in conf.glob("*.conf"):
        f.unlink()
    for name, text in confs.items():
        (conf / name).write_text(text)
    args = ("-d", "{root}", "-S", KVER, "-C", "{root}/etc/modprobe.d", "--show-depends", "nvidia")
    done = subprocess.run(kmod_argv(base, root, "modprobe", *args), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [line.split()[0] for line in done.stdout.splitlines()]


def twin_hw(root: Path) -> hwsim.Hw:
    hw = hwsim.Hw(root)
    hw.state["kernel"] = KVER  # as booted
    return hw


def twin_kmod(root: Path) -> list[str]:
    """The same question to the twin: the softdeps it loads, then nvidia's own action."""
    hw = twin_hw(root)
    install, pre, post = hw.probe_plan("nvidia", hw.modprobe_conf())
    return ["insmod"] * len(pre) + ["install" if install else "insmod"] + ["insmod"] * len(post)


CASES = pytest.mark.parametrize(
    ("softdep", "confs", "expected"),
    [
        # the real nvidia.ko's softdep: its comma makes one name kmod cannot find, so the
        # install line still runs
        (None, {"gpuhost-vfio.conf": OLD_CLAIM}, ["install"]),
        # a softdep kmod resolves: the install line is ignored, the claim would never run
        ("pre: ecdh_generic ecdsa_generic", {"gpuhost-vfio.conf": OLD_CLAIM}, ["insmod"] * 3),
        # gpuhost's file: its empty softdep sorts before modules.softdep, so the command runs
        ("pre: ecdh_generic ecdsa_generic", {"gpuhost-vfio.conf": CLAIM}, ["install"]),
        (None, {"gpuhost-vfio.conf": CLAIM}, ["install"]),
        # a softdep of the user's in a file that sorts first still wins: no claim
        (
            "",
            {"aa-user.conf": "softdep nvidia pre: ecdh_generic\n", "gpuhost-vfio.conf": CLAIM},
            ["insmod", "insmod"],
        ),
        # the usual "softdep nvidia pre: vfio-pci" in vfio.conf: modules.softdep sorts first
        # and holds nvidia's own line, so the user's never counts (its names resolve nothing)
        (None, {"vfio.conf": "softdep nvidia pre: ecdh_generic\n"}, ["insmod"]),
        (None, {"a-vfio.conf": "softdep nvidia pre: ecdh_generic\n"}, ["insmod", "insmod"]),
        # only the first install line counts
        (
            "",
            {"aa-user.conf": "install nvidia /bin/true\n", "gpuhost-vfio.conf": CLAIM},
            ["install"],
        ),
    ],
    ids=[
        "nvidia-comma",
        "well-formed-old-line",
        "well-formed-gpuhost",
        "nvidia-gpuhost",
        "user-softdep-first",
        "user-softdep-after-modules-softdep",
        "user-softdep-before-modules-softdep",
        "first-install",
    ],
)


@CASES
def test_the_twin_decides_as_real_kmod(tmp_path, cache, softdep, confs, expected) -> None:
    root = tree(tmp_path, cache, softdep)
    assert real_kmod(root, confs) == expected
    assert twin_kmod(root) == expected


@CASES
def test_the_twin_decides_as_trixies_kmod(
    tmp_path, cache, trixie_base, softdep, confs, expected
) -> None:
    """PVE 9: Debian 13's kmod 34, run in the trixie base, decides each case the same."""
    root = tree(tmp_path, cache, softdep, trixie_base)
    assert real_kmod(root, confs, trixie_base) == expected
    assert twin_kmod(root) == expected


def test_first_install_line_is_the_one_that_runs(tmp_path, cache) -> None:
    root = tree(tmp_path, cache, "")
    confs = {"aa-user.conf": "install nvidia /bin/true\n", "gpuhost-vfio.conf": CLAIM}
    real_kmod(root, confs)
    hw = twin_hw(root)
    install, _, _ = hw.probe_plan("nvidia", hw.modprobe_conf())
    assert install == "/bin/true"
