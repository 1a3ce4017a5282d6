for g in /sys/kernel/iommu_groups/*; do [ -d "$g" ] || continue; printf "%s" "${g##*/}"; for d in "$g"/devices/*; do printf " %s" "${d##*/}"; done; echo; done
