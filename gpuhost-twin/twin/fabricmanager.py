"""A stand-in for NVIDIA's nvidia-fabricmanager Debian package, for NVSwitch twins.

A real .deb, built with dpkg-deb, named and versioned as NVIDIA's CUDA repository names them:
`nvidia-fabricmanager-<branch>_<version>-1_amd64.deb` up to the R575 branch, plain
`nvidia-fabricmanager_<version>-1_amd64.deb` from R580 on (Package and Version fields to
match: Version is the driver version plus the Debian revision, "595.71.05-1"). It holds what
gpuhost and the audit rely on, where NVIDIA's package puts it:

    /usr/bin/nv-fabricmanager                      the daemon (-c CONFIG, -v)
    /usr/share/nvidia/nvswitch/fabricmanager.cfg   its configuration (a conffile)
    /lib/systemd/system/nvidia-fabricmanager.service
                                                   Type=forking, ExecStart=/usr/bin/nv-fabricmanager
                                                   -c /usr/share/nvidia/nvswitch/fabricmanager.cfg

The daemon does, on the twin's simulated hardware, what the real one does through the NVSwitch
driver: it configures the fabric (`gpuhost-twin-fabric configure <its version>`, hwshim/fabric.py),
which the driver refuses for a fabric manager of another version than the loaded driver, then
forks, detaches and keeps a pid file. Until it has run, CUDA fails on the twin with
CUDA_ERROR_SYSTEM_NOT_READY, as on a real NVSwitch board.

    build_fabricmanager("595.71.05", Path("/tmp/fm"))  # -> .../nvidia-fabricmanager_595.71.05-1_amd64.deb
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

CONFIG = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
UNIT = "lib/systemd/system/nvidia-fabricmanager.service"

DAEMON = """#!/bin/sh
# gpuhost-twin stand-in for nv-fabricmanager @VERSION@ (twin/fabricmanager.py).
VERSION=@VERSION@
config=
while [ $# -gt 0 ]; do
  case "$1" in
    -c|--config) shift; config="$1" ;;
    -v|--version) echo "Fabric Manager version is : $VERSION"; exit 0 ;;
    *) echo "nv-fabricmanager: unknown option $1" >&2; exit 1 ;;
  esac
  shift
done
[ -n "$config" ] || config=@CONFIG@
[ -r "$config" ] || { echo "nv-fabricmanager: cannot read config file $config" >&2; exit 1; }
log=$(sed -n 's/^LOG_FILE_NAME=//p' "$config")
log=${log:-/var/log/fabricmanager.log}
mkdir -p "$(dirname "$log")" /var/run/nvidia-fabricmanager
echo "Fabric Manager version $VERSION is running" >>"$log"
if ! out=$(gpuhost-twin-fabric configure "$VERSION" 2>&1); then
  echo "$out" >>"$log"
  echo "nv-fabricmanager: $out" >&2
  exit 1
fi
echo "Successfully configured all the available NVSwitches to route GPU NVLink traffic." >>"$log"
( trap 'exit 0' TERM; while :; do sleep 3600; done ) </dev/null >/dev/null 2>&1 &
echo $! >/var/run/nvidia-fabricmanager/nv-fabricmanager.pid
exit 0
"""

CONFIG_TEXT = """# Fabric Manager configuration (gpuhost-twin stand-in; the keys of NVIDIA's file)
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/fabricmanager.log
LOG_APPEND_TO_LOG=1
DAEMONIZE=1
BIND_INTERFACE_IP=127.0.0.1
STARTING_TCP_PORT=16000
FABRIC_MODE=0
FABRIC_MODE_RESTART=0
STATE_FILE_NAME=/tmp/fabricmanager.state
FM_STAY_RESIDENT_ON_FAILURES=0
"""

SERVICE = f"""[Unit]
Description=NVIDIA fabric manager service

[Service]
User=root
PrivateTmp=false
Type=forking
TimeoutStartSec=240
ExecStart=/usr/bin/nv-fabricmanager -c {CONFIG}
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""


def package_name(version: str) -> str:
    """NVIDIA's package name for a driver version: branch-suffixed up to R575."""
    branch = int(version.split(".")[0])
    return f"nvidia-fabricmanager-{branch}" if branch <= 575 else "nvidia-fabricmanager"


def deb_name(version: str, revision: str = "1") -> str:
    return f"{package_name(version)}_{version}-{revision}_amd64.deb"


def build_fabricmanager(
    version: str, directory: Path, name: str | None = None, revision: str = "1"
) -> Path:
    """Build the stand-in package of fabric manager ``version`` into ``directory`` with
    dpkg-deb; ``name`` overrides the file name (a misnamed package, for tests)."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / (name or deb_name(version, revision))
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        files = {
            "usr/bin/nv-fabricmanager": (
                DAEMON.replace("@VERSION@", version).replace("@CONFIG@", CONFIG),
                0o755,
            ),
            CONFIG.lstrip("/"): (CONFIG_TEXT, 0o644),
            UNIT: (SERVICE, 0o644),
            "DEBIAN/conffiles": (CONFIG + "\n", 0o644),
            "DEBIAN/control": (
                f"Package: {package_name(version)}\n"
                f"Version: {version}-{revision}\n"
                "Architecture: amd64\n"
                "Maintainer: gpuhost-twin <gpuhost-twin@localhost>\n"
                "Section: multiverse/libs\n"
                "Priority: optional\n"
                "Description: Fabric Manager for NVSwitch based systems (gpuhost-twin stand-in)\n"
                " The fabric manager daemon, its configuration and its systemd unit, for a\n"
                " simulated NVSwitch host.\n",
                0o644,
            ),
        }
        for rel, (text, mode) in files.items():
            path = tree / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(out)],
            check=True,
            capture_output=True,
        )
    return out
