"""Only the NVIDIA kernel modules: `pyinfra inventory/<site>.py deploys/nvidia_modules.py`.

The same Plan as gpu_host.py, applying just its driver_modules (a no-op without driver.source).
"""

from pyinfra import host

from deploys import context, driver

driver.configure(context.plan(host))
