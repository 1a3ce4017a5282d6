#!/usr/bin/env bash
# Capture, on a real NVIDIA GPU host, the raw output of every command gpuhost's facts run,
# so parsers can be tested on real output. Usage: capture-raw.sh OUTDIR
# Each capture is OUTDIR/<name>.out (stdout), <name>.err (stderr) and <name>.rc (exit status).
set -u
out=${1:?usage: capture-raw.sh OUTDIR}
mkdir -p "$out"
export LANG=C LC_ALL=C

cap() {  # cap NAME COMMAND...
  local name=$1; shift
  printf '%s\n' "$*" >"$out/$name.cmd"
  bash -c "$*" >"$out/$name.out" 2>"$out/$name.err"
  echo $? >"$out/$name.rc"
}

{
  echo "captured_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "hostname: $(hostname)"
  echo "uname: $(uname -a)"
} >"$out/CAPTURE-INFO"

# --- PCI (sysfs) -------------------------------------------------------------------------
cap pci_devices 'for d in /sys/bus/pci/devices/*; do
  printf "bdf=%s path=%s" "${d##*/}" "$(readlink -f "$d")"
  for a in vendor device class subsystem_vendor subsystem_device numa_node driver_override; do
    v=$(cat "$d/$a" 2>/dev/null); printf " %s=%s" "$a" "${v:--}"
  done
  drv=$(readlink "$d/driver" 2>/dev/null); grp=$(readlink "$d/iommu_group" 2>/dev/null)
  printf " driver=%s iommu_group=%s\n" "${drv##*/}" "${grp##*/}"
done'
cap iommu_groups 'for g in /sys/kernel/iommu_groups/*; do [ -d "$g" ] || continue; printf "%s" "${g##*/}"; for d in "$g"/devices/*; do printf " %s" "${d##*/}"; done; echo; done'
cap lspci_Dnnk 'lspci -D -nn -k'
cap lspci_Dnnvv 'lspci -D -nn -vv'
cap lspci_tv 'lspci -tv'

# --- nvidia-smi ----------------------------------------------------------------------------
Q=index,pci.bus_id,name,uuid,driver_version,memory.total,compute_cap,persistence_mode,vbios_version,pci.device_id
cap smi_query "nvidia-smi --query-gpu=$Q --format=csv,nounits"
cap smi_query_noheader "nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits"
cap smi_query_units "nvidia-smi --query-gpu=$Q --format=csv"
cap smi_plain 'nvidia-smi'
cap smi_L 'nvidia-smi -L'
cap smi_q 'nvidia-smi -q'
cap smi_qx 'nvidia-smi -q -x'
cap smi_version 'nvidia-smi --version'
cap smi_topo_m 'nvidia-smi topo -m'
for k in r w n a p; do cap "smi_topo_p2p_$k" "nvidia-smi topo -p2p $k"; done
cap smi_bad_index 'nvidia-smi -i 99 --query-gpu=index --format=csv'
cap smi_nvlink_s 'nvidia-smi nvlink -s'
cap smi_help_query 'nvidia-smi --help-query-gpu'

# --- /proc and /sys ------------------------------------------------------------------------
cap proc_driver_nvidia_version 'cat /proc/driver/nvidia/version'
cap proc_driver_nvidia_gpus 'for f in /proc/driver/nvidia/gpus/*/information; do echo "==> $f <=="; cat "$f"; done'
cap proc_driver_nvidia_params 'cat /proc/driver/nvidia/params'
cap proc_driver_nvidia_registry 'cat /proc/driver/nvidia/registry'
cap proc_driver_nvidia_ls 'ls -lR /proc/driver/nvidia/ /proc/driver/nvidia-caps/ 2>&1'
cap proc_devices 'cat /proc/devices'
cap proc_cmdline 'cat /proc/cmdline'
cap proc_version 'cat /proc/version'
cap proc_modules 'cat /proc/modules'
cap proc_uptime 'cat /proc/uptime; cat /proc/sys/kernel/random/boot_id'
cap lsmod 'lsmod'
cap uname_r 'uname -r'
cap module_params 'for m in nvidia nvidia_uvm nvidia_modeset nvidia_drm vfio vfio_pci vfio_iommu_type1; do for f in /sys/module/$m/parameters/*; do [ -f "$f" ] || continue; printf "%s %s %s\n" "$m" "${f##*/}" "$(cat "$f" 2>/dev/null || echo "<unreadable>")"; done; done'
cap sys_module_ls 'ls /sys/module'
cap modinfo_nvidia 'modinfo nvidia'
cap modinfo_uvm 'modinfo nvidia_uvm'
cap dev_nvidia 'ls -l /dev/nvidia* /dev/nvidia-caps 2>&1; stat -c "%n %F %t %T" /dev/nvidia* 2>&1'
cap firmware_ls 'ls -lR /lib/firmware/nvidia 2>&1 | head -100'
cap lscpu 'lscpu'
cap cpu_vendor 'grep -m1 vendor_id /proc/cpuinfo'
cap numa_nodes 'cat /sys/devices/system/node/online; ls /sys/devices/system/node'
cap dmesg_nvrm 'dmesg 2>&1 | grep -i -E "nvrm|nvidia|iommu|dmar|amd-vi" | head -200'
cap os_release 'cat /etc/os-release'
cap gcc_version 'gcc --version | head -1; cc --version | head -1'
exit 0
