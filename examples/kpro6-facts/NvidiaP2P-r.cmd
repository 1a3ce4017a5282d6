nvidia-smi topo -p2p r 2>&1; echo "#gpuhost-exit=$?"
