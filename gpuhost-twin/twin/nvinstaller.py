"""A stand-in for NVIDIA's driver installer, `NVIDIA-Linux-x86_64-<ver>.run`, for twins.

Like the real one it is a self-extracting shell script (a makeself header with a tar payload
after it) with the real file name, run as ``sh NVIDIA-Linux-x86_64-<ver>.run [options]``. It
takes the options of nvidia-installer that gpuhost uses (NVIDIA/nvidia-installer's
option_table.h: --silent/-s, --no-questions/-q, --ui=none, --accept-license/-a,
--no-kernel-modules and its alias --no-kernel-module, --no-kernel-module-source,
--no-nouveau-check/-z, --no-x-check,
--no-systemd, --no-dkms, --version/-v) and makeself's --extract-only/-x, and refuses any other
option as nvgetopt does (`nvidia-installer: unrecognized option: "--x"`). It cannot build
kernel modules: without --no-kernel-modules it stops with a message.

With --no-kernel-modules it installs what gpuhost relies on, where the real one puts it:
libcuda.so.<ver> and libnvidia-ml.so.<ver> (real libraries of that version, twin/userspace.py)
with their .so.1 and .so links in /usr/lib/x86_64-linux-gnu (after removing another version's,
as the real one uninstalls the previous driver), /usr/bin/nvidia-persistenced (a stand-in that
forks and writes its pid file), and the GSP firmware /lib/firmware/nvidia/<ver>/gsp_*.bin
(twin/modbuild.py's format); then ldconfig. nvidia-smi goes to /usr/bin like the real one's,
as a stand-in that asks the driver what the real one asks it through NVML (GUEST_SMI below), so
it also works inside a container, which has no twin shims; where /usr/bin/nvidia-smi is the
twin's own shim (a twin host: twin/hardware.py) it is left alone, as that shim is the hardware's
tool there. nvidia-modprobe is left alone (the twin's shim stands in for it).

    build_installer("595.71.05", Path("/tmp/nv"))   # -> /tmp/nv/NVIDIA-Linux-x86_64-595.71.05.run
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from twin.modbuild import GSP_FIRMWARE, firmware_blob
from twin.userspace import LIBDIR, UserspaceCache

PERSISTENCED = """#!/usr/bin/python3
# gpuhost-twin stand-in for nvidia-persistenced. Like the real daemon it forks, keeps a pid file,
# and holds every GPU's /dev/nvidiaN open (that is what keeps the driver's state up); it lets go
# of (or takes again) a GPU when nvidia-smi -i <bdf> -pm 0|1 asks, which reaches the real one
# through its per-device RPC (nvpdsetpersistencemode): here released.json and SIGUSR1. It
# answers with the minors it holds in held.json. The machine running the twin has no nvidia
# driver, so a real open() of the node fails (ENXIO): it holds O_PATH descriptors, which
# /proc/<pid>/fd shows the same way (the node's device number), for whoever scans it.
# Like the real one it builds its device table once, at start (nvidia-persistenced.c:
# setup_devices() takes the driver's GPUs from nvidia-cfg's get_pci_devices, called once from
# main): a GPU that the nvidia driver did not have then (it was on vfio-pci) is not in the table,
# and a request for it answers NVPD_ERR_DEVICE_NOT_FOUND (nvPdSetDevicePersistenceMode ->
# get_device). The table (its BDFs) is kept in devices.json for the nvidia-smi shim.
import glob, json, os, signal, sys
RUN = "/var/run/nvidia-persistenced"
os.makedirs(RUN, exist_ok=True)
def minors():
    found = {}
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        for line in open(info):
            if line.startswith("Device Minor:"):
                found[info.split("/")[-2]] = int(line.split(":", 1)[1])
    return found
table = sorted(minors())
if os.path.exists(RUN + "/released.json"):  # a new daemon holds every GPU of its table
    os.remove(RUN + "/released.json")
with open(RUN + "/devices.json", "w") as f:
    json.dump(table, f)
if os.fork():
    sys.exit(0)
os.setsid()
null = os.open("/dev/null", os.O_RDWR)  # a daemon lets go of its caller's terminal or session
for fd in (0, 1, 2):
    os.dup2(null, fd)
held = {}
def sync(*_):
    try:
        released = set(json.load(open(RUN + "/released.json")))
    except (OSError, ValueError):
        released = set()
    now = minors()
    for minor in sorted(now[bdf] for bdf in table if bdf in now):
        node = f"/dev/nvidia{minor}"
        if not os.path.exists(node):
            continue
        if minor in released and minor in held:
            os.close(held.pop(minor))
        elif minor not in released and minor not in held:
            held[minor] = os.open(node, os.O_PATH)  # the machine has no nvidia driver to open
    tmp = RUN + "/.held.json"
    with open(tmp, "w") as f:
        json.dump(sorted(held), f)
    os.replace(tmp, RUN + "/held.json")
signal.signal(signal.SIGUSR1, sync)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
sync()
with open(RUN + "/nvidia-persistenced.pid", "w") as f:
    f.write(f"{os.getpid()}\\n")
while True:
    signal.pause()
"""

# nvidia-smi as the real one behaves on top of NVML, for the queries gpuhost and its tests make:
# -L, --query-gpu=FIELDS --format=csv[,noheader][,nounits]. NVML learns the driver's version
# and GPUs from the kernel module (here: the twin's RM file, hwsim/rm.py, which a container
# sees through its read-only /proc/driver) and opens /dev/nvidiactl and each /dev/nvidia<minor>:
# a GPU whose node is missing or that the device cgroup denies (EPERM) is not listed; with no
# real driver behind an allowed node, open() answers ENXIO, which counts as reachable.
GUEST_SMI = r"""#!/usr/bin/python3
# gpuhost-twin stand-in for nvidia-smi @VERSION@ (installed by NVIDIA-Linux-x86_64-@VERSION@.run)
import errno, os, stat, sys

VERSION = "@VERSION@"
RM = "/proc/driver/gpuhost-twin-rm"
FIELDS = {"index", "name", "uuid", "pci.bus_id", "driver_version", "count"}


def reachable(path, major, minor):
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
        return False
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as exc:
        return exc.errno in (errno.ENXIO, errno.ENODEV)
    return True


def main(argv):
    try:
        lines = open(RM).read().splitlines()
    except OSError:
        sys.stdout.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                         "driver. Make sure that the latest NVIDIA driver is installed and running.\n")
        return 9
    version, gpus = None, []
    for line in lines:
        words = line.split(" ", 4)
        if words[0] == "version":
            version = words[1]
        elif words[0] == "gpu" and len(words) == 5:
            gpus.append({"bdf": words[1], "minor": int(words[2]), "uuid": words[3], "name": words[4]})
    if not reachable("/dev/nvidiactl", 195, 255):
        sys.stdout.write("Failed to initialize NVML: Unknown Error\n")
        return 255
    if version != VERSION:
        sys.stdout.write("Failed to initialize NVML: Driver/library version mismatch\n"
                         f"NVML library version: {VERSION}\n")
        return 18
    gpus = [g for g in gpus if reachable(f"/dev/nvidia{g['minor']}", 195, g["minor"])]
    if not gpus:
        sys.stdout.write("No devices were found\n")
        return 6
    if argv == ["-L"]:
        for i, g in enumerate(gpus):
            sys.stdout.write(f"GPU {i}: {g['name']} (UUID: {g['uuid']})\n")
        return 0
    query = [a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")]
    fmt = [a.split("=", 1)[1] for a in argv if a.startswith("--format=")]
    if len(query) != 1 or len(fmt) != 1 or len(argv) != 2 or "csv" not in fmt[0].split(","):
        sys.stderr.write("nvidia-smi (gpuhost-twin stand-in): only -L and "
                         "--query-gpu=FIELDS --format=csv[,noheader] are simulated\n")
        return 2
    fields = [f.strip() for f in query[0].split(",")]
    unknown = [f for f in fields if f not in FIELDS]
    if unknown:
        sys.stdout.write(f'Field "{unknown[0]}" is not a valid field to query.\n')
        return 2
    if "noheader" not in fmt[0].split(","):
        sys.stdout.write(", ".join(fields) + "\n")
    for i, g in enumerate(gpus):
        bus = "00000000" + g["bdf"][4:].upper()
        values = {"index": str(i), "name": g["name"], "uuid": g["uuid"], "pci.bus_id": bus,
                  "driver_version": version, "count": str(len(gpus))}
        sys.stdout.write(", ".join(values[f] for f in fields) + "\n")
    return 0


sys.exit(main(sys.argv[1:]))
"""

HEADER = """#!/bin/sh
# Stand-in for NVIDIA-Linux-x86_64-@VERSION@.run, built by gpuhost-twin (twin/nvinstaller.py).
VERSION=@VERSION@
nokm=0 extract=0
while [ $# -gt 0 ]; do
  case "$1" in
    -s|--silent|-q|--no-questions|--ui=none|-a|--accept-license|-z|--no-nouveau-check) ;;
    --no-x-check|--no-systemd|--no-dkms|--no-kernel-module-source) ;;
    --no-kernel-modules|--no-kernel-module) nokm=1 ;;
    --ui) shift; [ "$1" = none ] || { echo "ERROR: --ui: only 'none' here" >&2; exit 1; } ;;
    -x|--extract-only) extract=1 ;;
    -v|--version) echo "nvidia-installer:  version $VERSION"; exit 0 ;;
    *) echo "nvidia-installer: unrecognized option: \\"$1\\"" >&2; exit 1 ;;
  esac
  shift
done
skip=$(awk '/^__PAYLOAD__$/ { print NR + 1; exit }' "$0")
if [ "$extract" = 1 ]; then
  mkdir -p "NVIDIA-Linux-x86_64-$VERSION" &&
    tail -n +"$skip" "$0" | tar -xzf - -C "NVIDIA-Linux-x86_64-$VERSION"
  exit $?
fi
if [ "$nokm" != 1 ]; then
  echo "ERROR: this stand-in of NVIDIA-Linux-x86_64-$VERSION.run (gpuhost-twin) cannot build" \\
    "kernel modules; run it with --no-kernel-modules" >&2
  exit 1
fi
[ "$(id -u)" = 0 ] || { echo "ERROR: nvidia-installer must be run as root" >&2; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
tail -n +"$skip" "$0" | tar -xzf - -C "$tmp" || exit 1
lib=/@LIBDIR@
mkdir -p "$lib" /usr/bin "/lib/firmware/nvidia/$VERSION" || exit 1
for name in libcuda libnvidia-ml; do
  rm -f "$lib/$name".so*
  cp "$tmp/$name.so.$VERSION" "$lib/" && ln -s "$name.so.$VERSION" "$lib/$name.so.1" &&
    ln -s "$name.so.1" "$lib/$name.so" || exit 1
done
cp "$tmp/nvidia-persistenced" /usr/bin/ && chmod 0755 /usr/bin/nvidia-persistenced || exit 1
if ! head -c 200 /usr/bin/nvidia-smi 2>/dev/null | grep -q 'gpuhost twin: simulated hardware'; then
  cp "$tmp/nvidia-smi" /usr/bin/nvidia-smi.new && chmod 0755 /usr/bin/nvidia-smi.new &&
    mv -f /usr/bin/nvidia-smi.new /usr/bin/nvidia-smi || exit 1
fi
cp "$tmp"/firmware/gsp_*.bin "/lib/firmware/nvidia/$VERSION/" || exit 1
ldconfig
mkdir -p /var/log && echo "nvidia-installer $VERSION: installed (no kernel modules)" \\
  >/var/log/nvidia-installer.log
exit 0
__PAYLOAD__
"""


def installer_name(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}.run"


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def build_installer(
    version: str, directory: Path, cache: UserspaceCache | None = None, name: str | None = None
) -> Path:
    """Write the stand-in installer of driver ``version`` into ``directory``; ``name``
    overrides its file name (a misnamed installer, for tests)."""
    libs = (cache or UserspaceCache()).build(version)
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:gz") as tar:
        for path in libs.values():
            _add(tar, path.name, path.read_bytes(), 0o755)
        _add(tar, "nvidia-persistenced", PERSISTENCED.encode(), 0o755)
        _add(tar, "nvidia-smi", GUEST_SMI.replace("@VERSION@", version).encode(), 0o755)
        for blob in GSP_FIRMWARE:
            _add(tar, f"firmware/{blob}", firmware_blob(version))
    header = HEADER.replace("@VERSION@", version).replace("@LIBDIR@", LIBDIR)
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / (name or installer_name(version))
    out.write_bytes(header.encode() + payload.getvalue())
    out.chmod(0o755)
    return out
