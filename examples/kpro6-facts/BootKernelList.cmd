proxmox-boot-tool kernel list
