"""kmod 30's tools on the simulated kernel: lsmod, modprobe (the kernel side is hwsim.modules),
modinfo and depmod (the real kmod binary, pointed at the simulated kernel)."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import IO

from .common import err, hwsim, load_hw, out, root


def lsmod(argv: list[str]) -> int:
    hw = load_hw()
    mods = hw.modules() if hw else {}
    out("Module                  Size  Used by\n")
    for line in hw.p("proc/modules").read_text().splitlines() if hw and mods else []:
        name, size, refs, users = line.split()[:4]
        used = "" if users == "-" else " " + users.rstrip(",")
        out(f"{name:<19} {int(size):>8}  {refs}{used}\n")
    return 0


def modprobe(argv: list[str], lock: IO[str] | None = None) -> int:
    """modprobe [-r] [-q] [-a] [-n] [-i] name [params]. ``lock``: the machine's lock file,
    held by the caller; it is let go while an install command runs (its own modprobe calls
    take it), as the real kernel serialises nothing between the two."""
    hw = load_hw()
    if hw is None or not hw.kernel:
        err("modprobe: FATAL: twin: the machine has not booted")
        return 1
    remove = quiet = all_names = dry = ignore_install = False
    words = []
    for a in argv:
        if a in ("-r", "--remove"):
            remove = True
        elif a in ("-q", "--quiet"):
            quiet = True
        elif a in ("-a", "--all"):
            all_names = True
        elif a in ("-n", "--dry-run"):
            dry = True
        elif a in ("-i", "--ignore-install", "--ignore-remove"):
            ignore_install = True
        elif a.startswith("-"):
            continue  # -v, -b, -s ...: no effect on the simulation
        else:
            words.append(a)
    if not words:
        err("modprobe: ERROR: missing parameters. See -h.")
        return 1
    hw.apply_writes()  # sysfs writes made since the last tool ran (the kernel applies them at once)
    hw.install_runner = functools.partial(_run_unlocked, lock)
    names, params = (words, []) if all_names or remove else (words[:1], words[1:])
    code = 0
    conf = hw.modprobe_conf()
    for name in names:
        if dry:
            if not hw.module_exists(name):
                err(
                    f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{hw.kernel}"
                )
                code = 1
            continue
        if remove:
            ok, message = hw.unload(name)
        else:
            ok, message = hw.load(name, params, conf, ignore_install=ignore_install)
        if not ok:
            code = 1
            if not quiet or "not found" not in message:
                err(message)
    hw.write_views()
    hw.save()
    return code


def _run_unlocked(lock: IO[str] | None, command: str, env: dict[str, str]) -> tuple[int, str]:
    """An install command, as kmod's command_do runs it: system(3) with MODPROBE_MODULE set;
    its output goes where modprobe's goes."""
    if lock is not None:
        fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        sys.stdout.flush()
        proc = subprocess.run(["/bin/sh", "-c", command], env={**os.environ, **env}, check=False)
    finally:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
    return proc.returncode, ""


def kmod_binary(hw_root: Path) -> str:
    for candidate in (
        hw_root / "usr/bin/kmod",
        hw_root / "bin/kmod",
        Path("/usr/bin/kmod"),
        Path("/bin/kmod"),
    ):
        if candidate.exists():
            return str(candidate)
    return "kmod"


def modinfo(argv: list[str]) -> int:
    """Real kmod modinfo on the real .ko, with names resolved against the simulated kernel."""
    hw = load_hw()
    args, target, kver = [], None, None
    it = iter(argv)
    for a in it:
        if a in ("-k", "--set-version"):
            kver = next(it, None)
        elif a in ("-F", "--field", "-b", "--basedir"):
            args += [a, next(it, "")]
        elif a.startswith("-"):
            args.append(a)
        else:
            target = a
    if target is None:
        err("modinfo: ERROR: missing module or filename.")
        return 1
    path = Path(target)
    if "/" not in target and not target.endswith(".ko") and hw is not None:
        kver = kver or hw.kernel
        ko = hw.find_ko(target, kver)
        if (
            ko is None
            and hwsim.norm(target) in hwsim.IN_TREE
            and hw.p(f"lib/modules/{kver}").is_dir()
        ):
            return modinfo_intree(hwsim.norm(target), kver, hw, args)
        if ko is None:
            err(f"modinfo: ERROR: Module {target} not found.")
            return 1
        path = ko
    elif hw is not None and not path.is_absolute():
        path = Path.cwd() / path
    kmod = kmod_binary(hw.root if hw else root())
    proc = subprocess.run(
        ["modinfo", *args, str(path)],
        executable=kmod,
        capture_output=True,
        text=True,
        env=dict(os.environ, LC_ALL="C"),
        check=False,
    )
    prefix = str(hw.root).rstrip("/") if hw else ""
    text = proc.stdout.replace(prefix + "/lib/modules/", "/lib/modules/") if prefix else proc.stdout
    out(text)
    sys.stderr.write(proc.stderr)
    return proc.returncode


def modinfo_intree(name: str, kver: str, hw: hwsim.Hw, args: list[str]) -> int:
    """In-tree modules exist only in the catalogue: the fields modinfo would show (constructed)."""
    mod = hwsim.IN_TREE[name]
    fields = [
        ("filename", f"/lib/modules/{kver}/{mod['path']}"),
        ("description", mod["desc"]),
        ("license", "GPL v2"),
        ("depends", ",".join(mod["deps"])),
        ("retpoline", "Y"),
        ("intree", "Y"),
        ("name", name),
        ("vermagic", hw.kernel_info(kver)["vermagic"] + " "),
    ]
    fields += [("parm", f"{p}:(bool)") for p in mod["params"]]
    if "-F" in args:
        want = args[args.index("-F") + 1]
        out("".join(v + "\n" for k, v in fields if k == want))
        return 0
    out("".join(f"{k + ':':<16}{v}\n" for k, v in fields))
    return 0


def depmod(argv: list[str]) -> int:
    """Real depmod, defaulting to the simulated kernel (the real one would ask the host's uname)."""
    hw = load_hw()
    args = list(argv)
    if hw and hw.kernel and not any(re.match(r"^\d+\.\d+", a) for a in args):
        args.append(hw.kernel)
    kmod = kmod_binary(hw.root if hw else root())
    rc = subprocess.run(["depmod", *args], executable=kmod).returncode  # kmod reads argv[0]
    release = next((a for a in args if re.match(r"^\d+\.\d+", a)), None)
    if rc == 0 and hw and release:
        _index_simulated_zfs(hw, release)
    return rc


def _index_simulated_zfs(hw, release: str) -> None:
    """A simulated Proxmox kernel's zfs.ko and spl.ko are not materialised as ELF files (its
    twin-kernel.json says it has them): list them in modules.dep as depmod would."""
    record = hw.p(f"lib/modules/{release}/twin-kernel.json")
    dep = hw.p(f"lib/modules/{release}/modules.dep")
    if not record.exists() or not dep.exists() or not json.loads(record.read_text()).get("zfs"):
        return
    text = dep.read_text()
    if not hwsim.storage.ZFS_MODULE.search(text):
        dep.write_text(text + "zfs/zfs.ko: zfs/spl.ko\nzfs/spl.ko:\n")
