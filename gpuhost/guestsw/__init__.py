"""Software inside GPU guests: CUDA toolkits, uv venvs, environment files."""
