#!/bin/sh
# On a real NVIDIA GPU machine (no Proxmox needed): gather every fact gpuhost reads through
# pyinfra's @local connector, parse it, and plan a split of this machine's GPUs from the live
# facts and from the saved snapshot. Changes nothing. Usage: tools/device-check.sh OUTDIR
set -eu
out=${1:?usage: tools/device-check.sh OUTDIR}
mkdir -p "$out"
gpus=$(nvidia-smi -L | grep -c '^GPU ')
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
second=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | sed -n 2p | sed 's/^0000//')
vm=""
if [ "$gpus" -ge 2 ]; then
  vm="{'kind': 'vm', 'vmid': 129, 'name': 'vm129', 'machine': 'q35', 'gpus': ['$second']},"
fi
cat >"$out/inventory.py" <<INV
from gpuhost.spec.inventory import gpu_host
hosts = [gpu_host("@local", {
    "kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "$driver"},
    "guests": [$vm {"kind": "lxc", "ctid": 200, "name": "ct200", "gpus": [0]}],
})]
INV
python3 -m gpuhost.cli capture @local --out "$out/snapshot"
python3 -m gpuhost.cli plan "$out/inventory.py" >"$out/plan-live.txt"
python3 -m gpuhost.cli plan "$out/inventory.py" --facts "$out/snapshot" >"$out/plan-snapshot.txt"
cmp "$out/plan-live.txt" "$out/plan-snapshot.txt"
cat "$out/plan-live.txt"
