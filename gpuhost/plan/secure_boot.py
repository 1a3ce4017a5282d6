"""What UEFI Secure Boot will refuse, refused by the plan before the first change (pure).

With Secure Boot in force (gpuhost/observe/boot.py BootPathInfo.secure_boot):
- shim loads only a kernel signed by a key it trusts (its built-in vendor key, the firmware's
  db, or an enrolled MOK); GRUB asks shim to verify the `linux` image and fails the entry with
  "bad shim signature" otherwise. Shown on the real chain: tests/vm/test_secure_boot.py.
- the kernel locks itself down (integrity) and loads no module without a valid signature:
  with IMA's arch policy (security/integrity/ima/ima_efi.c arch_get_ima_policy, on Debian's
  kernel) Secure Boot turns module signature enforcement on, and kernel/module/signing.c
  module_sig_check rejects an unsigned module ("Loading of unsigned module is rejected";
  insmod: "Key was rejected by service"); without it, lockdown refuses it
  (security_locked_down(LOCKDOWN_MODULE_SIGNATURE)). Shown on Debian's signed kernel in the
  same test.

gpuhost signs nothing yet: the kernel it builds (kernel.source: build) and the NVIDIA modules it
builds (driver.source) are unsigned, so on such a host a trial would only come back, and a
committed boot would leave every GPU without its driver. What the host already runs was
accepted by its firmware and kernel, so it is never refused here.
"""

from __future__ import annotations

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.spec.host import HostSpec

OFF = "turn Secure Boot off in the firmware setup (or `mokutil --disable-validation`) and run again"
NO_MOK = "gpuhost cannot sign with an enrolled MOK key yet"


def check_secure_boot(spec: HostSpec, facts: HostFacts, problems: list[str]) -> None:
    if not facts.boot_path.secure_boot:
        return
    running = facts.kernel.release
    target = spec.kernel.version
    if spec.kernel.source == "build" and running != target:
        problems.append(
            f"Secure Boot is on, and kernel.source: build boots kernel {target} as gpuhost builds "
            'it, unsigned: shim refuses to load it ("bad shim signature"), so its trial can only '
            f"fail; {OFF}, or use Proxmox's signed kernel (kernel.source: package); {NO_MOK}"
        )
    driver = facts.driver
    loaded = driver is not None and driver.version == spec.driver.version and running == target
    if spec.driver.source is not None and not loaded:
        problems.append(
            f"Secure Boot is on, so kernel {target} runs locked down and loads no unsigned "
            "module, and driver.source installs NVIDIA modules as gpuhost builds them, unsigned: "
            f"the GPUs would have no driver after the boot; {OFF}, or leave driver.source unset "
            f"and install modules signed with your own MOK key (as DKMS does); {NO_MOK}"
        )
