"""The guest deploy: `pyinfra inventory/<site>.py deploys/gpu_guest.py --limit ct200`.

Runs on the GPU containers that gpuhost.pve.guests.guests_of() adds to the inventory (GPU
hosts and guests the spec does not name are skipped). For each, it reads the guest once and its
node's Plan (for the guest's environment, e.g. NCCL_P2P_DISABLE=1 where P2P is unsafe), prints
the guest software plan, refuses it before any change when it cannot work (a CUDA toolkit the
host driver branch cannot run, a requirement against a pin), then applies it
(deploys/guest_software.py): NVIDIA's CUDA repository and toolkits side by side with the spec's
default, the managed environment, uv and the venvs with their pins, and the venvs' services.
"""

from pyinfra import host

from deploys import guest_software
from gpuhost.pve.guests import GuestEntry
from gpuhost.spec.guests import LxcGuest
from gpuhost.spec.inventory import GUEST_KEY

entry = host.data.get(GUEST_KEY)
if isinstance(entry, GuestEntry) and isinstance(entry.spec, LxcGuest):
    guest_software.configure(guest_software.guest_plan(host))
