cat /proc/driver/nvidia/version 2>/dev/null || true
