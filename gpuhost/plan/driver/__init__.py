"""The Plan's NVIDIA driver: modules, their options and toolchain, userspace."""
