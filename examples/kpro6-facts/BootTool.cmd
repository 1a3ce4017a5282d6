proxmox-boot-tool status 2>&1; echo "#gpuhost-exit=$?"
