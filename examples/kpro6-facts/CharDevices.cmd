cat /proc/devices
