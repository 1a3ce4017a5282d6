cat /proc/cmdline
