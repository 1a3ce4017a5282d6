#!/usr/bin/env bash
# Capture GuestStatuses' command on a real kernel with a real LXC container and a real process
# shaped like Proxmox's QEMU, on a machine that is not a Proxmox host but has LXC (the
# development machine): Proxmox's own running tests read exactly these (/proc/net/unix, the
# VM's pid file, /proc/<pid>/stat and cmdline), so the parser is tested on what a kernel shows.
#   sudo tools/capture-guest-statuses.sh OUTDIR ROOTFS
# ROOTFS: a Debian root directory for the container (bound read-only; e.g. a twin base).
# It makes, and removes after: /etc/pve (a stand-in: local, lxc/200.conf running, lxc/201.conf
# stopped, qemu-server/129.conf running, qemu-server/130.conf with a stale pid file), LXC
# container "200" under /var/lib/lxc, /var/run/qemu-server/{129,130}.pid.
set -euo pipefail
out=${1:?usage: capture-guest-statuses.sh OUTDIR ROOTFS}
rootfs=${2:?usage: capture-guest-statuses.sh OUTDIR ROOTFS}
[ ! -e /etc/pve ] || { echo "/etc/pve exists: not on a Proxmox host" >&2; exit 1; }
[ ! -e /var/lib/lxc/200 ] || { echo "/var/lib/lxc/200 exists" >&2; exit 1; }
mkdir -p "$out"
cleanup() {
    lxc-stop -n 200 -k >/dev/null 2>&1 || true
    [ -z "${kvm:-}" ] || kill "$kvm" 2>/dev/null || true
    rm -rf /etc/pve /var/lib/lxc/200 /var/run/qemu-server
}
trap cleanup EXIT
mkdir -p /etc/pve/nodes/capture/lxc /etc/pve/nodes/capture/qemu-server /var/lib/lxc/200
ln -s nodes/capture /etc/pve/local
ln -s nodes/capture/lxc /etc/pve/lxc
ln -s nodes/capture/qemu-server /etc/pve/qemu-server
for f in lxc/200 lxc/201 qemu-server/129 qemu-server/130; do echo "# stand-in" >"/etc/pve/$f.conf"; done
cat >/var/lib/lxc/200/config <<CONF
lxc.uts.name = ct200
lxc.rootfs.path = dir:$rootfs
lxc.rootfs.options = ro
lxc.net.0.type = none
lxc.autodev = 1
lxc.tty.max = 0
lxc.mount.auto = proc:mixed sys:ro
lxc.apparmor.profile = unconfined
lxc.init.cmd = /bin/sleep 600
CONF
lxc-start -n 200 -P /var/lib/lxc
lxc-wait -n 200 -s RUNNING -t 30
mkdir -p /var/run/qemu-server
# QEMU's argv as qemu-server starts it (its first words), on a stand-in that only sleeps: the
# system python named /usr/bin/kvm, its script read from fd 3 (the one extra word, /dev/fd/3)
(exec -a /usr/bin/kvm /usr/bin/python3 /dev/fd/3 -id 129 -name vm129,debug-threads=on \
    -no-shutdown -chardev socket,id=qmp,path=/var/run/qemu-server/129.qmp,server=on,wait=off \
    -pidfile /var/run/qemu-server/129.pid -daemonize 3<<<'import time; time.sleep(600)') &
kvm=$!
sleep 1
echo "$kvm" >/var/run/qemu-server/129.pid
echo 999999 >/var/run/qemu-server/130.pid
command=$(PYTHONPATH=$(dirname "$0")/.. python3 -c \
    'from gpuhost.observe.proxmox import GuestStatuses; print(GuestStatuses().command())')
printf '%s\n' "$command" >"$out/GuestStatuses.cmd"
sh -c "$command" >"$out/GuestStatuses.out" 2>"$out/GuestStatuses.err" && rc=0 || rc=$?
echo "$rc" >"$out/GuestStatuses.rc"
[ -s "$out/GuestStatuses.err" ] || rm -f "$out/GuestStatuses.err"
grep -E '^Num|/command$' /proc/net/unix >"$out/proc_net_unix.out" || true
{
    echo "captured_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "hostname: $(hostname)"
    echo "uname: $(uname -a)"
    echo "lxc: $(lxc-start --version)"
} >"$out/CAPTURE-INFO"
