nvidia-smi topo -m 2>&1; echo "#gpuhost-exit=$?"
