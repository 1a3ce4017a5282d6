grep -H . /sys/kernel/iommu_groups/*/type 2>/dev/null; for i in /sys/class/iommu/*; do [ -e "$i" ] && echo "iommu ${i##*/}"; done; true
