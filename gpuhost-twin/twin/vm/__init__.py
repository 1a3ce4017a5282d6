"""The vm tier: real Debian systems (OVMF, GRUB or systemd-boot, a real kernel, initramfs-tools,
systemd) booted in QEMU under TCG, for gpuhost's real deploy over SSH.

image.py builds and caches the disk images; qemu.py runs a VM on a qcow2 overlay of one.
"""
