grep -m1 vendor_id /proc/cpuinfo
