nvidia-smi --query-gpu=index,pci.bus_id,name,uuid,driver_version,memory.total,compute_cap,persistence_mode,vbios_version,pci.device_id --format=csv,nounits 2>&1; echo "#gpuhost-exit=$?"
