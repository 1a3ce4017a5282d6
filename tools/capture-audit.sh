#!/usr/bin/env bash
# Capture, on a real NVIDIA GPU host, the raw output the audit reads beyond the deploy's facts:
# device nodes, firmware files, NVIDIA userspace libraries, module files and the CUDA probe.
# Usage: capture-audit.sh OUTDIR  (run from the repository root: it runs gpuhost/probes/cuda_probe.py)
set -u
out=${1:?usage: capture-audit.sh OUTDIR}
mkdir -p "$out"
export LANG=C LC_ALL=C
cap() {  # cap NAME COMMAND...
  local name=$1; shift
  printf '%s\n' "$*" >"$out/$name.cmd"
  bash -c "$*" >"$out/$name.out" 2>"$out/$name.err"
  echo $? >"$out/$name.rc"
  [ -s "$out/$name.err" ] || rm -f "$out/$name.err"
}
{
  echo "captured_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "hostname: $(hostname)"
  echo "uname: $(uname -a)"
} >"$out/CAPTURE-INFO"
cap dev_stat 'stat -c "%n|%F|%t|%T|%a" /dev/nvidia* /dev/nvidia-caps/*'
cap firmware_files 'ls -1 /lib/firmware/nvidia/*/gsp*.bin'
cap ldconfig_nvidia 'ldconfig -p | grep -E "libcuda|libnvidia-ml"'
cap libcuda_files 'ls -l /usr/lib/x86_64-linux-gnu/libcuda* /usr/lib64/libcuda* /usr/local/nvidia/lib64/libcuda* 2>/dev/null'
cap module_files 'find /lib/modules/$(uname -r) -name "nvidia*.ko*" 2>/dev/null; ls /lib/modules'
cap fabricmanager 'dpkg-query -W -f "\${Package} \${Version} \${db:Status-Abbrev}\n" "nvidia-fabricmanager*"'
cap nvswitch_sysfs 'grep -l 0x068000 /sys/bus/pci/devices/*/class'
cap systemctl_fm 'systemctl is-active nvidia-fabricmanager.service'
cap python_version 'python3 --version'
cap cuda_probe 'time python3 gpuhost/probes/cuda_probe.py 4096 1048576 67108864'
cap cuda_probe_hidden 'CUDA_VISIBLE_DEVICES= python3 gpuhost/probes/cuda_probe.py 4096'
cap nvidia_smi_version 'nvidia-smi --version'
