"""Where gpuhost keeps its own things on a host: its directories and the globs of every file it
manages, read back by the managed-files fact. Every managed path the plan names lies under one of
MANAGED_PATHS (a test checks it)."""

STATE_DIR = "/var/lib/gpuhost"  # gpuhost's own records (pending steps, last reboot, trial, backups)
LIB_DIR = "/usr/local/lib/gpuhost"  # its boot scripts
CONFIG_DIR = "/etc/gpuhost"  # its own copies of shared settings (the kernel command line)
# The metrics timer's runtime (gpuhost and pydantic for the host's python3): one directory per
# content key, and the link to the one in use, switched atomically (gpuhost/build/runtime.py).
RUNTIME_DIR = "/opt/gpuhost"
RUNTIME_LINK = f"{RUNTIME_DIR}/current"
METRICS_SCRIPT = f"{LIB_DIR}/metrics"  # what gpuhost-metrics.service runs
READY_DIR = f"{CONFIG_DIR}/ready"  # each GPU guest's readiness contract, <vmid>.json
# gpuhost's Proxmox hookscript: a snippet of the `local` dir storage (pve-installer: /var/lib/vz)
HOOKSCRIPT_VOLID = "local:snippets/gpuhost-ready"
HOOKSCRIPT = "/var/lib/vz/snippets/gpuhost-ready"

# Every file a deploy writes, edits or records. Owned files are named gpuhost-* or live in
# gpuhost's directories; shared files (/etc/kernel/cmdline, /etc/default/grub and its drop-ins,
# read to know the user's own kernel parameters) are never rewritten wholesale.
MANAGED_PATHS = (
    "/etc/kernel/cmdline",
    "/etc/default/grub",
    "/etc/default/grub.d/*.cfg",
    f"{CONFIG_DIR}/*",
    f"{READY_DIR}/*.json",
    HOOKSCRIPT,
    "/etc/modprobe.d/gpuhost-*.conf",
    "/etc/modules-load.d/gpuhost-*.conf",
    "/etc/initramfs-tools/hooks/gpuhost-*",
    "/etc/systemd/system/gpuhost-*",
    "/etc/systemd/system/*.wants/gpuhost-*",
    "/etc/systemd/system/*.d/gpuhost-*.conf",
    f"{LIB_DIR}/*",
    f"{STATE_DIR}/*",
    # Proxmox's, read only: the node name (/etc/pve/local links to nodes/<node>), the cluster
    # CA the API is verified against, and the PCI mappings gpuhost creates through the API.
    "/etc/pve/local",
    "/etc/pve/pve-root-ca.pem",
    "/etc/pve/mapping/pci.cfg",
    "/etc/pve/storage.cfg",  # which storage has `snippets` content (the hookscript's)
)
