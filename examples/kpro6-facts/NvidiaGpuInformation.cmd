for f in /proc/driver/nvidia/gpus/*/information; do [ -f "$f" ] || continue; echo "==> $f <=="; cat "$f"; done
