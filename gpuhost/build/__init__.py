"""Kernel and NVIDIA module builds, the artifact store, build hosts."""
