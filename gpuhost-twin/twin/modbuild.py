"""Real kernel modules for the twin: Proxmox-named headers and tiny .ko files built with real gcc.

The twin's kernels are simulated, but modules are real ELF objects: the simulated kernel reads
their vermagic and .comment exactly as a real one would. Debian's linux-headers (6.1) are
re-stamped with a Proxmox release name so `make -C /lib/modules/<kver>/build M=$PWD modules`
produces a .ko whose vermagic is "<kver> SMP preempt mod_unload modversions" (docs/development.md: ~1 s).

    headers = stamp_headers(Path("/"), "6.8.12-9-pve", dest)         # dest/usr/src/linux-headers-...
    ko = build_module(headers, "nvidia", "580.159.04", workdir)      # gcc-12, like the kernel
    ko = build_module(headers, "nvidia", "580.159.04", workdir, cc="gcc-11")  # toolchain mismatch
    ModuleCache(sysroot=trixie_base, cc="gcc-14")   # built inside a twin base (its headers, gcc)
    install_driver(root, "6.8.12-9-pve", "580.159.04", kos)           # + GSP firmware
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

# gcc-11 cannot take these gcc-12 flags the Debian 6.1 config turns on; dropping them changes
# nothing the twin checks (the .comment still names gcc-11).
GCC11_OVERRIDES = ["CONFIG_INIT_STACK_ALL_ZERO=", "CONFIG_CC_HAS_AUTO_VAR_INIT_ZERO="]
CAPTURED_DRIVER = "580.159.04"  # the driver of the real H200 captures
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
# The modules' own MODULE_SOFTDEP, as the real ones declare it: the open nvidia.ko's
# kernel-open/nvidia/libspdm_ecc.c, compiled in where the kernel has the crypto it uses. Its
# comma makes one name kmod cannot find, so it adds no softdep; depmod lists it all the same.
SOFTDEPS = {"nvidia": "pre: ecdh_generic,ecdsa_generic"}
GSP_FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


def firmware_blob(version: str) -> bytes:
    """The content of a twin GSP firmware file of driver ``version``."""
    return b"twin GSP firmware " + version.encode() + b"\n"


class ModuleBuildError(RuntimeError):
    """make failed; the message carries its output."""


def debian_headers(root: Path) -> Path | None:
    """The newest Debian linux-headers-*-amd64 tree under root (not -common, not a twin copy)."""
    found = [
        d
        for d in (root / "usr/src").glob("linux-headers-*-amd64")
        if (d / "Makefile").exists() and not d.name.endswith("-common")
    ]
    return max(found, key=lambda d: d.name) if found else None


STAMPED = ("Makefile", "include/generated/utsrelease.h", "include/config/kernel.release")


def _config_marker(path: Path) -> bool:
    """An empty include/config/<SYMBOL> file: Kconfig touches one per option only so that
    fixdep's dependency lists (scripts/basic/fixdep.c writes them as
    ``$(wildcard include/config/<SYMBOL>)``) can rebuild what an option change affects. make's
    wildcard ignores an absent one, so an out-of-tree build needs none of them; leaving out
    ~6,400 symlinks makes a stamp take milliseconds on the twin's overlay instead of seconds."""
    return path.is_file() and not path.is_symlink() and path.stat().st_size == 0


def _link_tree(src: Path, dest: Path, target: str, real: tuple[str, ...], rel: str = "") -> None:
    """dest mirrors src with absolute symlinks (to ``target``, src's path as the twin sees it),
    except the ``real`` files (copied) and the directories on their way (made)."""
    dest.mkdir(parents=True, exist_ok=True)
    for child in src.iterdir():
        path = f"{rel}{child.name}"
        if rel == "include/config/" and _config_marker(child):
            continue
        if path in real:
            shutil.copy2(child, dest / child.name, follow_symlinks=False)
        elif (
            any(r.startswith(path + "/") for r in real)
            and child.is_dir()
            and not child.is_symlink()
        ):
            _link_tree(child, dest / child.name, f"{target}/{child.name}", real, path + "/")
        elif child.is_symlink() and not os.readlink(child).startswith("/"):
            (dest / child.name).symlink_to(os.readlink(child))  # relative links keep their meaning
        else:
            (dest / child.name).symlink_to(f"{target}/{child.name}")


def stamp_headers(src_root: Path, kver: str, dest_root: Path) -> Path:
    """Copy Debian's arch headers to dest_root/usr/src/linux-headers-<kver> named as <kver>.

    Only the release string changes (Makefile, utsrelease.h, kernel.release); the shared -common
    tree and linux-kbuild are referenced by absolute paths, valid inside the twin and on the host.
    """
    src = debian_headers(src_root)
    if src is None:
        raise ModuleBuildError(f"no Debian linux-headers-*-amd64 under {src_root}/usr/src")
    dest = dest_root / f"usr/src/linux-headers-{kver}"
    if dest == src:  # that kernel's own headers (a twin made from a capture of a twin)
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    # A symlink farm, not a copy: only the files that carry the release are real, so stamping
    # takes milliseconds instead of copying ~6,500 files per kernel per twin.
    _link_tree(src, dest, "/" + str(src.relative_to(src_root)), STAMPED)
    old = src.name.removeprefix("linux-headers-")
    for rel in ("Makefile", "include/generated/utsrelease.h"):
        f = dest / rel
        f.write_text(f.read_text().replace(old, kver))
    (dest / "include/config/kernel.release").write_text(kver + "\n")
    for link in ("scripts", "tools"):
        target = dest / link
        if target.is_symlink() and not os.readlink(target).startswith("/"):
            absolute = os.path.normpath(os.path.join("/usr/src", os.readlink(target)))
            target.unlink()
            target.symlink_to(absolute)
    return dest


def in_sysroot(sysroot: Path, shared: Path, argv: list[str]) -> list[str]:
    """argv, to run chrooted into sysroot (a twin base) with the directory ``shared`` on its
    /mnt, in a private mount namespace: the bind mount is gone when the command ends, and the
    base itself is never written to."""
    script = 'mount --bind "$1" "$2/mnt" && shift 2 && exec chroot "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            str(shared), str(sysroot), str(sysroot),
            "env", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", *argv]  # fmt: skip


MODULE_C = """\
#include <linux/module.h>
MODULE_LICENSE("{license}");
MODULE_VERSION("{version}");
MODULE_DESCRIPTION("gpuhost twin stand-in for {name}");{softdep}
static int __init twin_init(void) {{ return 0; }}
static void __exit twin_exit(void) {{ }}
module_init(twin_init);
module_exit(twin_exit);
"""


def build_module(
    headers: Path,
    name: str,
    version: str,
    workdir: Path,
    cc: str = "gcc-12",
    license: str = "Dual MIT/GPL",
    softdep: str | None = None,
    chroot: tuple[Path, Path] | None = None,
) -> Path:
    """Build a real, empty <name>.ko with version= against headers, with compiler cc, and its
    MODULE_SOFTDEP (default: the real module's, SOFTDEPS; "" for none).

    chroot=(sysroot, shared): make runs chrooted into sysroot (a twin base: its gcc, its kbuild),
    with the directory ``shared`` (holding headers and workdir) bind-mounted on sysroot's /mnt in
    a private mount namespace, so the base itself is never written to."""
    src = workdir / f"{name}-{cc}"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    value = SOFTDEPS.get(name, "") if softdep is None else softdep
    line = f'\nMODULE_SOFTDEP("{value}");' if value else ""
    (src / f"{name}.c").write_text(
        MODULE_C.format(name=name, version=version, license=license, softdep=line)
    )
    (src / "Kbuild").write_text(f"obj-m := {name}.o\n")
    inside = (
        (lambda p: p) if chroot is None else (lambda p: Path("/mnt") / p.relative_to(chroot[1]))
    )
    cmd = ["make", "-s", "-C", str(inside(headers)), f"M={inside(src)}", f"CC={cc}", "modules"]
    if cc == "gcc-11":
        cmd[-1:-1] = GCC11_OVERRIDES
    if chroot is not None:
        cmd = in_sysroot(*chroot, cmd)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    ko = src / f"{name}.ko"
    if proc.returncode != 0 or not ko.exists():
        raise ModuleBuildError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return ko


def install_driver(
    root: Path,
    kver: str,
    version: str,
    kos: dict[str, Path],
    firmware: bool = True,
    subdir: str = "updates/dkms",
) -> None:
    """Place built .ko files where DKMS would and, optionally, the GSP firmware of version."""
    target = root / f"lib/modules/{kver}/{subdir}"
    target.mkdir(parents=True, exist_ok=True)
    for name, ko in kos.items():
        shutil.copy2(ko, target / f"{name.replace('_', '-')}.ko")
    if firmware:
        fw = root / f"lib/firmware/nvidia/{version}"
        fw.mkdir(parents=True, exist_ok=True)
        for blob in GSP_FIRMWARE:
            (fw / blob).write_bytes(firmware_blob(version))


class ModuleCache:
    """Real .ko files built once per (kernel, compiler, version, license, name) into a directory.

    Without a workdir they go to $GPUHOST_TWIN_CACHE/kmods (default /var/cache/gpuhost-twin),
    keyed by the Debian headers and the module source, so a machine builds each one once.
    With a sysroot (a twin base, e.g. the trixie one) the modules are built inside it, against
    its Debian headers with its compiler (``cc``, the default of ko()): what a kernel of that
    base's series was built with.
    """

    def __init__(
        self, workdir: Path | None = None, sysroot: Path | None = None, cc: str = "gcc-12"
    ) -> None:
        self.sysroot = sysroot
        self.cc = cc
        if workdir is None:
            headers = debian_headers(sysroot or Path("/"))
            recipe = hashlib.sha256(
                f"{sysroot}{headers}{MODULE_C}{GCC11_OVERRIDES}{SOFTDEPS}".encode()
            ).hexdigest()[:12]
            base = Path(os.environ.get("GPUHOST_TWIN_CACHE", "/var/cache/gpuhost-twin"))
            workdir = base / "kmods" / recipe
        self.workdir = workdir
        self.headers: dict[str, Path] = {}

    def ko(
        self,
        name: str,
        kver: str,
        version: str = CAPTURED_DRIVER,
        cc: str | None = None,
        license: str = "Dual MIT/GPL",
        softdep: str | None = None,
    ) -> Path:
        cc = cc or self.cc
        key = f"{kver}/{cc}/{version}/{license.replace(' ', '_').replace('/', '_')}"
        if softdep is not None:  # another MODULE_SOFTDEP than the real module's
            key += "/softdep-" + hashlib.sha256(softdep.encode()).hexdigest()[:8]
        done = self.workdir / "ko" / key / f"{name}.ko"
        if done.exists():
            return done
        # One build at a time per cache: processes sharing it (test sessions, xdist workers, a
        # developer's twins) would otherwise re-stamp the headers another is compiling against
        # (stamp_headers starts with rmtree) or share a build directory.
        self.workdir.mkdir(parents=True, exist_ok=True)
        with (self.workdir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if done.exists():  # built by another process while this one waited
                return done
            if kver not in self.headers:
                self.headers[kver] = stamp_headers(
                    self.sysroot or Path("/"), kver, self.workdir / "hdr" / kver
                )
            built = build_module(
                self.headers[kver],
                name,
                version,
                self.workdir / "build" / key,
                cc=cc,
                license=license,
                softdep=softdep,
                chroot=None if self.sysroot is None else (self.sysroot, self.workdir),
            )
            done.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, done.with_suffix(".tmp"))
            os.replace(done.with_suffix(".tmp"), done)  # readers never see half a file
            shutil.rmtree(self.workdir / "build" / key, ignore_errors=True)
        return done

    def install(
        self,
        root: Path,
        kver: str,
        names: tuple[str, ...] = ("nvidia", "nvidia_uvm"),
        firmware: bool = True,
        **kw: str,
    ) -> None:
        version = kw.get("version", CAPTURED_DRIVER)
        kos = {n: self.ko(n, kver, **kw) for n in names}
        install_driver(root, kver, version, kos, firmware=firmware)
