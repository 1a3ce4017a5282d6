"""The twin's base root filesystems: Debian 12 or 13 made once with debootstrap, cached by recipe.

Every twin (and every guest container) is an overlay whose lower layer is one of these trees, so a
base is never written to after it is built. A profile's `pve:` picks the suite
(Profile.debian_suite: PVE 8 bookworm, PVE 9 trixie). The cache key is a hash of the recipe (suite,
packages and the source of the setup steps): change any of them and the next `ensure_base()`
builds a new base; each suite has its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

SUITE = "bookworm"  # the default suite: PVE 8's Debian 12
# What a Proxmox GPU host needs for the deploys: a package manager, the real toolchain and real
# Debian kernel headers for out-of-tree module builds, kmod, python3 (pyinfra facts and the twin's
# shims), TLS roots; openssh-server is for the guest containers, which run their own sshd.
PACKAGES = (
    "apt",
    "dpkg",
    "gcc-12",
    "make",
    "libc6-dev",
    "linux-headers-amd64",
    "kmod",
    "python3",
    "ca-certificates",
    "openssh-server",
    "grub2-common",  # real grub-editenv (grub-common), grub-reboot, grub-set-default on grubenv
)
# Debian 13, which PVE 9 is built on: the same roles with trixie's names. Its compiler is GCC 14
# (gcc-14 14.2.0, what Proxmox's 6.14 kernels of the PVE 9 series are built with); kmod 34 and
# initramfs-tools 0.148 are the real tools the twin's kmod and initramfs findings are checked
# against (tests/twin/test_hw_kmod.py, tests/twin/test_hw_initramfs.py).
SUITES: dict[str, tuple[str, ...]] = {
    SUITE: PACKAGES,
    "trixie": (
        *(p for p in PACKAGES if p not in ("gcc-12", "linux-headers-amd64")),
        "gcc-14",
        "initramfs-tools",
    ),  # + linux-headers-amd64, unpacked by _unpack_headers
}
CACHE_ROOT = Path(os.environ.get("GPUHOST_TWIN_CACHE", "/var/cache/gpuhost-twin"))


class RootfsError(RuntimeError):
    """The base rootfs cannot be built (no mirror, debootstrap failed, unsafe cache path)."""


@dataclass(frozen=True)
class Mirror:
    uri: str
    keyring: str | None  # Signed-By of the apt entry, handed to debootstrap --keyring


def find_mirror(etc_apt: Path = Path("/etc/apt"), suite: str = SUITE) -> Mirror:
    """The Debian mirror this machine's apt uses for suite, or GPUHOST_TWIN_MIRROR.

    A machine whose apt lists only another Debian suite (a Debian 12 CI runner building the
    trixie base) gets that suite's archive: one Debian archive serves every suite, and
    debian-archive-keyring holds the keys that sign them."""
    override = os.environ.get("GPUHOST_TWIN_MIRROR")
    if override:
        return Mirror(override.rstrip("/"), None)
    found = _apt_entry(etc_apt, suite)
    for other in (s for s in SUITES if s != suite and found is None):
        found = _apt_entry(etc_apt, other)
        if found and found.keyring and "debian-archive-keyring" not in found.keyring:
            found = None  # "<suite> main" of another archive (a vendor's) is no Debian mirror
    if found:
        return found
    raise RootfsError(
        f"no apt source for Debian '{suite}' main in {etc_apt}; set GPUHOST_TWIN_MIRROR=<mirror URL>"
    )


def _apt_entry(etc_apt: Path, suite: str) -> Mirror | None:
    for path in sorted((etc_apt / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = _deb822(stanza)
            if (
                "deb" in fields.get("types", "").split()
                and suite in fields.get("suites", "").split()
                and "main" in fields.get("components", "").split()
                and fields.get("enabled", "yes") != "no"
            ):
                return Mirror(fields["uris"].split()[0].rstrip("/"), fields.get("signed-by"))
    lists = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*.list"))]
    for path in lists:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            m = re.match(r"deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s+(.*)", line.strip())
            if m and m.group(3) == suite and "main" in m.group(4).split():
                opts = dict(o.split("=", 1) for o in (m.group(1) or "").split() if "=" in o)
                return Mirror(m.group(2).rstrip("/"), opts.get("signed-by"))
    return None


def _deb822(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = ""
    for line in stanza.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line[0].isspace() and key:
            fields[key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            fields[key] = value.strip()
    return fields


def _setup(root: Path) -> None:
    """Steps after debootstrap that make the tree a twin base (part of the recipe hash)."""
    # No service may start inside a twin from a package's postinst (there is no init system).
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\n# gpuhost twin: no init system, never start services\nexit 101\n")
    policy.chmod(0o755)
    # Each twin and guest makes its own host keys; none may be shared through the base.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "run/sshd").mkdir(parents=True, exist_ok=True)
    (root / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    make_dev(root / "dev")
    # /proc and /sys stay plain directories: the twin's boot writes plain files into them.
    for name in ("proc", "sys"):
        (root / name).mkdir(exist_ok=True)
    passwd = root / "etc/passwd"
    text = passwd.read_text()
    passwd.write_text(re.sub(r"^root:.*$", "root:x:0:0:root:/root:/bin/bash", text, flags=re.M))
    (root / "etc/hostname").write_text("localhost\n")
    subprocess.run(["chroot", str(root), "apt-get", "clean"], check=True)


def _unpack_headers(root: Path) -> None:
    """trixie's linux-headers-<ver>-amd64 depends on its linux-image (bookworm's does not), so
    installing it would bring a Debian kernel no Proxmox host has (the twin's loader would boot
    its /boot files) and build that kernel's initrd, the slowest step of the base. A module build
    needs its -common headers and linux-kbuild (installed, with their libraries) and the arch
    headers, which are unpacked (dpkg -x): dpkg knows no kernel and apt sees no unmet dependency."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")

    def chroot(*argv: str) -> str:
        done = subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RootfsError(f"{' '.join(argv)} in the base failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    def depends(package: str) -> list[str]:
        out = chroot("apt-cache", "depends", "--no-recommends", "--no-suggests", package)
        return [line.split(":", 1)[1].strip() for line in out.splitlines() if "Depends:" in line]

    (arch,) = [p for p in depends("linux-headers-amd64") if p.startswith("linux-headers-")]
    parts = [p for p in depends(arch) if p.endswith("-common") or p.startswith("linux-kbuild-")]
    chroot("apt-get", "install", "-y", "-q", "--no-install-recommends", *parts)
    chroot("sh", "-c", 'cd /tmp && apt-get download -q "$1" 2>&1', "sh", arch)
    for deb in sorted((root / "tmp").glob("*.deb")):
        chroot("dpkg-deb", "-x", f"/tmp/{deb.name}", "/")
        deb.unlink()
    chroot("apt-get", "clean")


# Setup steps only one suite needs (part of that suite's recipe hash).
SUITE_SETUP = {"trixie": _unpack_headers}


def make_dev(dev: Path) -> None:
    """What a login needs in a chroot: the basic character devices and a pty master."""
    for name, major, minor in (
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ):
        node = dev / name
        if node.is_symlink() or node.exists():
            node.unlink()
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        node.chmod(0o666)
    (dev / "pts").mkdir(exist_ok=True)
    ptmx = dev / "ptmx"
    if ptmx.is_symlink() or ptmx.exists():
        ptmx.unlink()
    ptmx.symlink_to("pts/ptmx")  # a twin bind-mounts the machine's devpts onto dev/pts
    (dev / "shm").mkdir(exist_ok=True)
    (dev / "shm").chmod(0o1777)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        if not (dev / name).is_symlink() and not (dev / name).exists():
            (dev / name).symlink_to(target)


def check_suite(suite: str) -> str:
    if suite not in SUITES:
        raise RootfsError(f"no twin base for Debian suite {suite!r}; known: {sorted(SUITES)}")
    return suite


def recipe_hash(suite: str = SUITE) -> str:
    steps = [inspect.getsource(_setup), inspect.getsource(make_dev)]
    if check_suite(suite) in SUITE_SETUP:
        steps.append(inspect.getsource(SUITE_SETUP[suite]))
    recipe = "\n".join([check_suite(suite), *SUITES[suite], *steps])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def base_path(suite: str = SUITE) -> Path:
    return CACHE_ROOT / f"base-{recipe_hash(suite)}"


def current_bases() -> set[Path]:
    """The bases today's recipes build, one per suite (kept when old ones are pruned)."""
    return {base_path(suite) for suite in SUITES}


def check_chroot_safe(path: Path) -> None:
    """sshd's ChrootDirectory refuses any component not root-owned or group/world-writable."""
    for part in [path, *path.parents]:
        st = part.stat()
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise RootfsError(
                f"{part} must be owned by root and not group/world-writable "
                f"(sshd ChrootDirectory demands it); twin paths cannot live under it"
            )


def forbidden() -> None:
    """Refuse to build or start twins where GPUHOST_TWIN_FORBID says why (gpuhost's unit-tier
    tests set it, so a test that boots a twin cannot hide among them)."""
    reason = os.environ.get("GPUHOST_TWIN_FORBID")
    if reason:
        raise RootfsError(reason)


def ensure_base(log: bool = True, suite: str = SUITE) -> Path:
    """Return the cached base rootfs of suite, building it first when its recipe has no cache."""
    forbidden()
    target = base_path(suite)
    if (target / ".gpuhost-twin-base").exists():
        return target
    CACHE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    check_chroot_safe(CACHE_ROOT)
    with open(CACHE_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a waiter then finds it done
        if (target / ".gpuhost-twin-base").exists():
            return target
        _build(target, find_mirror(suite=suite), log, suite)
    return target


def _build(target: Path, mirror: Mirror, log: bool, suite: str = SUITE) -> None:
    """debootstrap + _setup into target; the installer's output goes to CACHE_ROOT/build.log."""
    if not shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin"):
        raise RootfsError(
            "debootstrap is missing; install with: "
            "apt-get install $(grep -v '^#' gpuhost-twin/twin/APT_PACKAGES)"
        )
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if log else (lambda msg: None)
    logfile = CACHE_ROOT / "build.log"
    t0 = time.monotonic()
    say(f"building the {suite} twin base (one time, a few minutes; cached in {CACHE_ROOT})")
    tmp = target.with_name(target.name + ".building")
    if tmp.exists():
        _unmount_below(tmp)
        shutil.rmtree(tmp)
    tmp.mkdir(mode=0o755)
    cmd = ["debootstrap", "--variant=minbase", "--components=main"]
    cmd += [f"--include={','.join(SUITES[suite])}"]
    if mirror.keyring:
        cmd.append(f"--keyring={mirror.keyring}")
    cmd += [suite, str(tmp), mirror.uri]
    say(f"  debootstrap {suite} from {mirror.uri} (installer output: {logfile})")
    try:
        with open(logfile, "w") as out:
            out.write(" ".join(cmd) + "\n")
            out.flush()
            _debootstrap(cmd, out, say, t0)
            say(f"  packages installed ({time.monotonic() - t0:.0f} s); setting up the base")
            _setup(tmp)
            if suite in SUITE_SETUP:
                SUITE_SETUP[suite](tmp)
    except (subprocess.CalledProcessError, OSError) as exc:
        tail = logfile.read_text(errors="replace").splitlines()[-5:] if logfile.exists() else []
        raise RootfsError(
            f"building the twin base failed: {exc}; see {logfile}, which ends:\n  "
            + "\n  ".join(tail)
        ) from exc
    finally:
        _unmount_below(tmp)  # debootstrap can leave proc/sys mounted when it fails
    (tmp / ".gpuhost-twin-base").write_text(recipe_hash(suite) + "\n")
    tmp.rename(target)
    say(f"  twin base ready in {time.monotonic() - t0:.0f} s: {target}")


# debootstrap's own stage messages ("I: Retrieving apt 2.6.1", "I: Configuring dpkg...") by the
# verb that starts them: the base build's progress, one line per stage instead of silence.
STAGES = {
    "Retrieving": "downloading packages",
    "Validating": "downloading packages",  # each download's check, right after it
    "Extracting": "extracting packages",
    "Unpacking": "unpacking packages",
    "Configuring": "configuring packages",
}


def _debootstrap(cmd: list[str], log: IO[str], say: Callable[[str], None], t0: float) -> None:
    """Run debootstrap with its output in ``log``, saying each stage it enters as it goes."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    stage = ""
    for line in proc.stdout:
        log.write(line)
        words = line.removeprefix("I: ").split()
        verb = STAGES.get(words[0]) if line.startswith("I: ") and words else None
        if verb is not None and verb != stage:
            say(f"  {verb} ({time.monotonic() - t0:.0f} s)")
            stage = verb
    if proc.wait() != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def _unmount_below(path: Path) -> None:
    prefix = str(path.resolve()) + "/"
    for mnt in reversed(Path("/proc/self/mounts").read_text().splitlines()):
        point = mnt.split()[1]
        if point.startswith(prefix):
            subprocess.run(["umount", "-l", point], check=False)


def headers_version(base: Path) -> str:
    """The Debian kernel release whose headers the base holds (e.g. 6.1.0-37-amd64)."""
    versions = sorted(
        p.name
        for p in (base / "lib/modules").iterdir()
        if (p / "build").is_symlink() or (p / "build").is_dir()
    )
    if not versions:
        raise RootfsError(f"{base} has no /lib/modules/*/build: linux-headers did not install")
    return versions[-1]


if __name__ == "__main__":
    path = ensure_base(suite=sys.argv[1] if len(sys.argv) > 1 else SUITE)
    print(f"{path} ({headers_version(path)})")
