for d in /sys/bus/pci/devices/*; do
  printf "bdf=%s path=%s" "${d##*/}" "$(readlink -f "$d")"
  for a in vendor device class subsystem_vendor subsystem_device numa_node driver_override; do
    v=$(cat "$d/$a" 2>/dev/null); printf " %s=%s" "$a" "${v:--}"
  done
  drv=$(readlink "$d/driver" 2>/dev/null); grp=$(readlink "$d/iommu_group" 2>/dev/null)
  printf " driver=%s iommu_group=%s\n" "${drv##*/}" "${grp##*/}"
done
