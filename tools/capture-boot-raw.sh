#!/usr/bin/env bash
# raw boot/compiler state capture (exploratory)
out=${1:?}; mkdir -p "$out"; export LANG=C LC_ALL=C
cap() { local n=$1; shift; printf '%s\n' "$*" >"$out/$n.cmd"; bash -c "$*" >"$out/$n.out" 2>"$out/$n.err"; echo $? >"$out/$n.rc"; [ -s "$out/$n.err" ] || rm -f "$out/$n.err"; }
{ echo "captured_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "hostname: $(hostname)"; echo "uname: $(uname -a)"; } >"$out/CAPTURE-INFO"
cap proc_version 'cat /proc/version'
cap efi_dir 'ls -la /sys/firmware/efi 2>&1; ls /sys/firmware/efi/efivars 2>&1 | head -50'
cap efivars_od 'for f in /sys/firmware/efi/efivars/Loader*-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f /sys/firmware/efi/efivars/BootCurrent-*; do [ -e "$f" ] && { echo "== $f"; od -An -tx1 -v "$f"; }; done; true'
cap findmnt_boot 'findmnt -n -o SOURCE,FSTYPE -T /boot/grub; findmnt -n -o SOURCE,FSTYPE -T /boot; findmnt -n -o SOURCE,FSTYPE /boot/efi'
cap findmnt_all 'findmnt -rn -o TARGET,SOURCE,FSTYPE'
cap df_boot 'df -B1 --output=avail,size,target /boot /boot/efi 2>&1'
cap boot_ls 'ls -la /boot /boot/efi 2>&1'
cap kernel_configs 'for f in /boot/config-* /lib/modules/*/build/.config /proc/config.gz; do [ -e "$f" ] && echo "== $f"; done; grep -H "^CONFIG_CC_VERSION_TEXT" /boot/config-* /lib/modules/*/build/.config 2>/dev/null; zcat /proc/config.gz 2>/dev/null | grep -E "CONFIG_CC_VERSION_TEXT|CONFIG_GCC_VERSION|CONFIG_CC_IS"'
cap compilers 'for c in gcc cc $(cd /usr/bin && ls gcc-[0-9]* x86_64-linux-gnu-gcc-[0-9]* 2>/dev/null); do p=$(command -v $c) && echo "== $c $p" && $c --version | head -1; done; true'
cap ls_modules 'ls -la /lib/modules/ 2>&1; ls /lib/modules/$(uname -r) 2>&1 | head -30'
cap nvidia_ko 'for m in nvidia nvidia_uvm; do f=$(modinfo -n $m 2>/dev/null); echo "== $m $f"; done; find / -xdev -name "nvidia*.ko*" 2>/dev/null | head; cat /proc/driver/nvidia/version'
cap bootctl 'bootctl status 2>&1; echo rc=$?'
cap grubenv 'grub-editenv list 2>&1; grub2-editenv list 2>&1; ls /boot/grub /boot/grub2 2>&1'
cap os_release 'cat /etc/os-release'
cap meminfo 'grep -E "MemTotal|MemAvailable" /proc/meminfo; nproc'
cap proxmox_boot 'ls -la /etc/kernel 2>&1; cat /etc/kernel/proxmox-boot-uuids 2>&1; proxmox-boot-tool status 2>&1; echo rc=$?'
cap systemd_version 'systemctl --version | head -1; systemd-run --version | head -1'
tar -C "$out" -cf "$out.tar" . && mv "$out.tar" "$out/all.tar"
