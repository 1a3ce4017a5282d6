"""A profile's boot section (twin/profile.py ``Profile.boot``): firmware, loader and the factory
boot configuration.

Loaders:
- ``systemd-boot``: proxmox-boot-tool's ESPs, the command line in /etc/kernel/cmdline;
- ``grub``: /etc/default/grub, GRUB under /boot/grub (or on the ESPs: ``grub_on_esp``);
- ``none``: direct kernel boot. The firmware or hypervisor hands a kernel of its own choosing,
  with a command line of its own, to the machine (Firecracker's boot-source kernel_image_path
  and boot_args, QEMU's -kernel/-append): no boot loader, no /boot/grub, no ESP, nothing in
  the machine chooses the kernel. Every boot starts ``kernel`` with ``kernel_cmdline``, so a
  kernel pin or one-shot written inside has nothing to act on. The H200 captures are such
  machines (tests/fixtures/captures/h200x1-boot-raw: no EFI, empty /boot, no /boot/grub, no
  proxmox-boot-tool; /proc/cmdline without BOOT_IMAGE= or initrd=).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator


class Boot(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    firmware: Literal["uefi", "bios"]
    loader: Literal["systemd-boot", "grub", "none"]
    # systemd-boot: first line of /etc/kernel/cmdline; none: the whole command line the
    # hypervisor passes (init's arguments after "--" included); grub: the whole /etc/default/grub.
    kernel_cmdline: str | None = None
    default_grub: str | None = None
    esp_uuids: list[str] = ["9B1C-4F2A"]  # /etc/kernel/proxmox-boot-uuids (ESP hosts only)
    # GRUB installed on the ESPs by `proxmox-boot-tool init <part> grub` (Secure Boot or BIOS on
    # ZFS): each ESP has its own grub/grubenv, which GRUB can write (one-shot next_entry works).
    grub_on_esp: bool = False
    # Plain GRUB only: /boot on the LVM root (PVE ext4/xfs installs). GRUB's save_env cannot
    # write there ("diskfilter writes are not supported"), so next_entry is never cleared.
    boot_on_lvm: bool = True
    # The root file system the installer chose (hwsim/storage.py); None: ZFS where the ESPs are
    # proxmox-boot-tool's (systemd-boot, GRUB on the ESPs), else ext4 on LVM.
    root_fs: Literal["zfs", "btrfs", "ext4"] | None = None
    # loader none: the kernel release the hypervisor boots (one of the profile's kernels).
    kernel: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_esps(cls, data: Any) -> Any:
        """A machine without a loader has no ESP: esp_uuids defaults to none there."""
        if isinstance(data, dict) and data.get("loader") == "none" and "esp_uuids" not in data:
            return {**data, "esp_uuids": []}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Boot:
        if self.loader == "systemd-boot":
            if self.firmware != "uefi":
                raise ValueError(
                    f"boot.loader='systemd-boot' needs boot.firmware='uefi' (got {self.firmware!r});"
                    " use loader 'grub' for legacy BIOS"
                )
            if not self.kernel_cmdline or "root=" not in self.kernel_cmdline:
                raise ValueError(
                    f"boot.kernel_cmdline={self.kernel_cmdline!r} must hold root= for systemd-boot"
                    " (proxmox-boot-tool refuses it); e.g. 'root=ZFS=rpool/ROOT/pve-1 boot=zfs'"
                )
        if self.grub_on_esp and (self.loader != "grub" or not self.esp_uuids):
            raise ValueError("boot.grub_on_esp needs boot.loader='grub' and boot.esp_uuids")
        if self.loader == "grub" and not self.default_grub:
            raise ValueError(
                "boot.default_grub is empty; a GRUB host needs the initial /etc/default/grub text"
            )
        if self.loader == "none":
            self._direct()
        elif self.kernel is not None:
            raise ValueError(
                f"boot.kernel={self.kernel!r} is for boot.loader='none' (the hypervisor's kernel);"
                f" with loader {self.loader!r} the loader picks the kernel: remove it"
            )
        return self

    def _direct(self) -> None:
        if not self.kernel or self.kernel_cmdline is None:
            raise ValueError(
                "boot.loader='none' needs boot.kernel (the release the hypervisor boots) and"
                " boot.kernel_cmdline (the command line it passes, may be '')"
            )
        if self.esp_uuids or self.default_grub is not None:
            raise ValueError(
                "boot.loader='none' boots without a loader: remove boot.esp_uuids and"
                " boot.default_grub (a host's /etc/default/grub goes under start.files)"
            )
