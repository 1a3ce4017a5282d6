cat /proc/modules
