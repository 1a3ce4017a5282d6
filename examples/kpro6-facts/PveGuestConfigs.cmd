for f in /etc/pve/lxc/*.conf /etc/pve/qemu-server/*.conf; do [ -f "$f" ] || continue; echo "==> $f <=="; cat "$f"; done
