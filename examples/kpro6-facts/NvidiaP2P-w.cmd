nvidia-smi topo -p2p w 2>&1; echo "#gpuhost-exit=$?"
