"""The Plan's boot: the kernel command line gpuhost owns, in GRUB's or systemd-boot's files."""
