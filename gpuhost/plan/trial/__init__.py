"""The Plan's trial boots: a new kernel, command line or initramfs boots once before it is kept."""
