"""A stand-in pve-kernel tree for CI: the same packaging steps as proxmox/pve-kernel, on a tiny
kernel, written here (not copied from Proxmox).

Like pve-kernel (bookworm-6.14: Makefile, debian/rules), its top-level Makefile names the
release (KVNAME from KERNEL_MAJ/MIN/PATCHLEVEL, KREL, KREL_EXTRA) and prepares BUILD_DIR: the
kernel copied from submodules/ubuntu-kernel, its config made (Proxmox exports Ubuntu's
annotations; here: tinyconfig), EXTRAVERSION set, patches/kernel/*.patch applied, zfs prepared
from submodules/zfsonlinux by `make kernel`, debian/ copied with its control generated; then
`dpkg-buildpackage -b -uc -us` in BUILD_DIR. Its debian/rules applies config options with
scripts/config + olddefconfig, compiles the kernel, builds zfs.ko and spl.ko against it,
installs usr/lib/modules/KVNAME (zfs/ for ZFS), boot/{config,System.map,vmlinuz}-KVNAME, runs
depmod, and packs proxmox-kernel-KVNAME (with maintainer scripts that run the kernel hooks) and proxmox-headers-KVNAME with debhelper.

Where it differs, for CI's two cores: the kernel source is Debian's linux-source-6.1 (the tree
tests/build/kernel_cache.py unpacks), hard-linked rather than copied (patch and sed -i write new
files, so the cached tree is never changed); the config is tinyconfig plus what modules need,
built with ARCH=x86_64 (tinyconfig is 32-bit otherwise); zfs and spl are two small modules
built with Kbuild's M= (real zfs runs autogen/configure, which reads CC from the environment
make exports); the headers package holds what an out-of-tree build reads from the object tree
(config, Module.symvers, generated headers), not a whole source tree; no meta, tools, dbgsym or
signing-template packages, no ABI or firmware checks. The kernel package's maintainer
scripts are tests/kerneldebs.py's (depmod, then the /etc/kernel hooks, as Proxmox's do).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.kerneldebs import POSTINST, POSTRM

KREL = "2"  # 6.1.X-2-pve: not the plain build's 6.1.X-1-pve (tests/build/kernel_cache.py)
MAKEFILE = """\
# gpuhost test stand-in of a pve-kernel tree (see tests/build/pvekernel_standin.py)
include /usr/share/dpkg/pkg-info.mk

KERNEL_MAJ={maj}
KERNEL_MIN={min}
KERNEL_PATCHLEVEL={patchlevel}
# the package release; KREL_EXTRA tells co-installable builds apart (e.g. -bpo12)
KREL={krel}
KREL_EXTRA=

KERNEL_MAJMIN=$(KERNEL_MAJ).$(KERNEL_MIN)
KERNEL_VER=$(KERNEL_MAJMIN).$(KERNEL_PATCHLEVEL)
DEB_VERSION=$(KERNEL_VER)-$(KREL)
EXTRAVERSION=-$(KREL)$(KREL_EXTRA)-pve
KVNAME=$(KERNEL_VER)$(EXTRAVERSION)
PACKAGE=proxmox-kernel-$(KVNAME)
HDRPACKAGE=proxmox-headers-$(KVNAME)
ARCH=$(shell dpkg-architecture -qDEB_BUILD_ARCH)

BUILD_DIR=proxmox-kernel-$(KERNEL_VER)
KERNEL_SRC=ubuntu-kernel
KERNEL_SRC_SUBMODULE=submodules/$(KERNEL_SRC)
ZFSONLINUX_SUBMODULE=submodules/zfsonlinux
ZFSDIR=pkg-zfs
MODULES=modules
# x86_64, not the machine's x86: tinyconfig would make a 32-bit kernel
KBUILD_ARCH=x86_64

DST_DEB=$(PACKAGE)_$(DEB_VERSION)_$(ARCH).deb
HDR_DEB=$(HDRPACKAGE)_$(DEB_VERSION)_$(ARCH).deb

all: deb
deb: $(DST_DEB) $(HDR_DEB)

$(DST_DEB) $(HDR_DEB) &: $(BUILD_DIR).prepared
\tcd $(BUILD_DIR); dpkg-buildpackage -b -uc -us

$(BUILD_DIR).prepared: $(KERNEL_SRC).prepared $(MODULES).prepared debian.prepared
\ttouch $@

debian.prepared: debian
\trm -rf $(BUILD_DIR)/debian
\tmkdir -p $(BUILD_DIR)
\tcp -a debian $(BUILD_DIR)/debian
\tprintf '%s\\n' KVNAME=$(KVNAME) KERNEL_SRC=$(KERNEL_SRC) MODULES=$(MODULES) \\
\t    ZFSDIR=$(ZFSDIR) KBUILD_ARCH=$(KBUILD_ARCH) >$(BUILD_DIR)/debian/env.mk
\tsed -e 's/@KVNAME@/$(KVNAME)/g' debian/control.in >$(BUILD_DIR)/debian/control
\tfor s in postinst postrm; do sed -e 's/@KVNAME@/$(KVNAME)/g' debian/proxmox-kernel.$$s.in \\
\t    >$(BUILD_DIR)/debian/$(PACKAGE).$$s; chmod 755 $(BUILD_DIR)/debian/$(PACKAGE).$$s; done
\ttouch $@

$(KERNEL_SRC).prepared: $(KERNEL_SRC_SUBMODULE)
\trm -rf $(BUILD_DIR)/$(KERNEL_SRC) $@
\tmkdir -p $(BUILD_DIR)
\tcp -al $(KERNEL_SRC_SUBMODULE) $(BUILD_DIR)/$(KERNEL_SRC)
\t$(MAKE) -C $(BUILD_DIR)/$(KERNEL_SRC) ARCH=$(KBUILD_ARCH) tinyconfig
\tsed -i -e 's/^EXTRAVERSION.*$$/EXTRAVERSION = $(EXTRAVERSION)/' $(BUILD_DIR)/$(KERNEL_SRC)/Makefile
\tset -e; cd $(BUILD_DIR)/$(KERNEL_SRC); for p in ../../patches/kernel/*.patch; do \\
\t    echo "applying $$p"; patch --batch -p1 <"$$p"; done
\ttouch $@

$(MODULES).prepared: $(ZFSDIR).prepared
\ttouch $@

$(ZFSDIR).prepared: $(ZFSONLINUX_SUBMODULE)
\trm -rf $(BUILD_DIR)/$(MODULES) $@
\tmkdir -p $(BUILD_DIR)/$(MODULES)/tmp
\tcp -a $(ZFSONLINUX_SUBMODULE)/* $(BUILD_DIR)/$(MODULES)/tmp
\tcd $(BUILD_DIR)/$(MODULES)/tmp; $(MAKE) kernel
\trm -rf $(BUILD_DIR)/$(MODULES)/tmp
\ttouch $@

clean:
\trm -rf proxmox-kernel-[0-9]*/ *.prepared *.deb *.buildinfo *.changes
"""

RULES = """\
#!/usr/bin/make -f
# gpuhost test stand-in: the kernel, zfs and spl, into proxmox-kernel and proxmox-headers

BUILD_DIR=$(shell pwd)
include /usr/share/dpkg/default.mk
include debian/env.mk

MAKEFLAGS += $(subst parallel=,-j,$(filter parallel=%,$(DEB_BUILD_OPTIONS)))

PKG=proxmox-kernel-$(KVNAME)
HDR=proxmox-headers-$(KVNAME)
KMAKE=$(MAKE) -C $(KERNEL_SRC) ARCH=$(KBUILD_ARCH)
# what the modules and an initramfs boot need on top of tinyconfig
CONFIG_OPTS = -e 64BIT -e MODULES -e BLK_DEV_INITRD -e BINFMT_ELF -e TTY

build build-arch: .compile_mark .modules_compile_mark
build-indep:
binary binary-arch: .install_mark .headers_install_mark
\tdh_installdeb
\tdh_gencontrol
\tdh_md5sums
\tdh_builddeb -- -Zgzip
binary-indep:
clean:
\trm -rf .*_mark debian/$(PKG) debian/$(HDR) debian/files debian/*.substvars debian/.debhelper

.config_mark:
\tcd $(KERNEL_SRC); ./scripts/config $(CONFIG_OPTS)
\t$(KMAKE) olddefconfig
\ttouch $@

.compile_mark: .config_mark
\t$(KMAKE)
\ttouch $@

.modules_compile_mark: .compile_mark
\t$(KMAKE) M=$(BUILD_DIR)/$(MODULES)/$(ZFSDIR)/module modules
\tcp $(MODULES)/$(ZFSDIR)/module/zfs.ko $(MODULES)/$(ZFSDIR)/module/spl.ko $(MODULES)/
\ttouch $@

.install_mark: .compile_mark .modules_compile_mark
\trm -rf debian/$(PKG)
\tmkdir -p debian/$(PKG)/usr/lib/modules/$(KVNAME) debian/$(PKG)/boot
\tinstall -m 644 $(KERNEL_SRC)/.config debian/$(PKG)/boot/config-$(KVNAME)
\tinstall -m 644 $(KERNEL_SRC)/System.map debian/$(PKG)/boot/System.map-$(KVNAME)
\tinstall -m 644 $(KERNEL_SRC)/arch/x86/boot/bzImage debian/$(PKG)/boot/vmlinuz-$(KVNAME)
\t$(KMAKE) INSTALL_MOD_PATH=$(BUILD_DIR)/debian/$(PKG)/usr/ modules_install
\tinstall -d -m 0755 debian/$(PKG)/usr/lib/modules/$(KVNAME)/zfs
\tinstall -m 644 $(MODULES)/zfs.ko $(MODULES)/spl.ko debian/$(PKG)/usr/lib/modules/$(KVNAME)/zfs
\tfind debian/$(PKG)/usr/lib/modules -name '*.ko' -exec strip --strip-debug {} +
\trm -f debian/$(PKG)/usr/lib/modules/$(KVNAME)/build debian/$(PKG)/usr/lib/modules/$(KVNAME)/source
\t/sbin/depmod -b debian/$(PKG)/usr/ $(KVNAME)
\ttouch $@

.headers_install_mark: .compile_mark
\trm -rf debian/$(HDR)
\tmkdir -p debian/$(HDR)/usr/src/linux-headers-$(KVNAME) debian/$(HDR)/usr/lib/modules/$(KVNAME)
\tcd $(KERNEL_SRC); cp -a --parents .config Module.symvers Makefile include/generated \\
\t    include/config arch/x86/include/generated $(BUILD_DIR)/debian/$(HDR)/usr/src/linux-headers-$(KVNAME)/
\tln -sf /usr/src/linux-headers-$(KVNAME) debian/$(HDR)/usr/lib/modules/$(KVNAME)/build
\ttouch $@
"""

CONTROL = """\
Source: proxmox-kernel-standin
Section: devel
Priority: optional
Maintainer: gpuhost tests <root@localhost>
Build-Depends: debhelper-compat (= 13), bc, bison, flex, kmod, libelf-dev
Standards-Version: 4.6.2

Package: proxmox-headers-@KVNAME@
Architecture: any
Depends: ${misc:Depends}
Description: gpuhost test stand-in: kernel headers
 The config, symbol versions and generated headers of the stand-in kernel.

Package: proxmox-kernel-@KVNAME@
Section: admin
Architecture: any
Depends: ${misc:Depends}
Description: gpuhost test stand-in: kernel image with zfs and spl modules
 A tiny kernel built the way Proxmox packages its kernels.
"""

CHANGELOG = """\
proxmox-kernel-standin ({version}) bookworm; urgency=medium

  * gpuhost test stand-in of a pve-kernel build.

 -- gpuhost tests <root@localhost>  Thu, 01 Jan 2026 00:00:00 +0000
"""

ZFS_MAKEFILE = """\
# gpuhost test stand-in of zfsonlinux: `make kernel` prepares the module sources for the build
kernel:
\trm -rf ../pkg-zfs
\tcp -a upstream ../pkg-zfs
"""

KBUILD = "obj-m := spl.o zfs.o\n"
SPL_C = """\
// SPDX-License-Identifier: GPL-2.0
/* gpuhost test stand-in of the Solaris Porting Layer: one exported symbol zfs uses */
#include <linux/module.h>

int spl_standin_version(void)
{
\treturn 1;
}
EXPORT_SYMBOL(spl_standin_version);

MODULE_DESCRIPTION("gpuhost test stand-in: spl");
MODULE_LICENSE("GPL");
"""
ZFS_C = """\
// SPDX-License-Identifier: GPL-2.0
/* gpuhost test stand-in of zfs: loads only with spl, as the real one does */
#include <linux/module.h>

int spl_standin_version(void);

static int __init zfs_standin_init(void)
{
\treturn spl_standin_version() == 1 ? 0 : -EINVAL;
}
module_init(zfs_standin_init);

static void __exit zfs_standin_exit(void)
{
}
module_exit(zfs_standin_exit);

MODULE_DESCRIPTION("gpuhost test stand-in: zfs");
MODULE_LICENSE("GPL");
"""
ACS_PARAM = """
/* gpuhost test stand-in of Proxmox's ACS override patch: the parameter, not the quirk */
static int __init pcie_acs_override_setup(char *opts)
{
\treturn opts ? 0 : -EINVAL;
}
early_param("pcie_acs_override", pcie_acs_override_setup);
"""


def acs_patch(kernel: Path) -> str:
    """A patch adding the pcie_acs_override early_param to init/main.c of ``kernel``."""
    old = (kernel / "init/main.c").read_text().splitlines(keepends=True)
    new = [*old, *ACS_PARAM.splitlines(keepends=True)]
    diff = "".join(difflib.unified_diff(old, new, "a/init/main.c", "b/init/main.c"))
    return (
        "From: gpuhost tests <root@localhost>\n"
        "Subject: [PATCH] stand-in: accept pcie_acs_override\n\n---\n" + diff
    )


def sublevel(kernel: Path) -> tuple[str, str, str]:
    text = (kernel / "Makefile").read_text()[:2000]
    found = dict(re.findall(r"^(VERSION|PATCHLEVEL|SUBLEVEL) = (\d+)$", text, re.M))
    return found["VERSION"], found["PATCHLEVEL"], found["SUBLEVEL"]


def release(kernel: Path, krel: str = KREL) -> str:
    """The KVNAME the stand-in built on ``kernel`` names: X.Y.Z-<krel>-pve."""
    return ".".join(sublevel(kernel)) + f"-{krel}-pve"


def write_standin(dest: Path, kernel: Path, krel: str = KREL) -> Path:
    """The stand-in tree at ``dest`` on the kernel source ``kernel`` (hard-linked in as
    submodules/ubuntu-kernel; ``dest`` must be on its file system, else it is copied)."""
    maj, mnr, patchlevel = sublevel(kernel)
    files = {
        "Makefile": MAKEFILE.format(maj=maj, min=mnr, patchlevel=patchlevel, krel=krel),
        "debian/rules": RULES,
        "debian/control.in": CONTROL,
        "debian/proxmox-kernel.postinst.in": POSTINST,
        "debian/proxmox-kernel.postrm.in": POSTRM,
        "debian/changelog": CHANGELOG.format(version=f"{maj}.{mnr}.{patchlevel}-{krel}"),
        "patches/kernel/0001-stand-in-accept-pcie_acs_override.patch": acs_patch(kernel),
        "submodules/zfsonlinux/Makefile": ZFS_MAKEFILE,
        "submodules/zfsonlinux/upstream/module/Kbuild": KBUILD,
        "submodules/zfsonlinux/upstream/module/spl.c": SPL_C,
        "submodules/zfsonlinux/upstream/module/zfs.c": ZFS_C,
    }
    for name, text in files.items():
        path = dest / name
        if not path.is_file() or path.read_text() != text:  # mtimes are in the inputs hash
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    (dest / "debian/rules").chmod(0o755)
    ubuntu = dest / "submodules/ubuntu-kernel"
    if not ubuntu.is_dir():
        staging = ubuntu.with_name(f".ubuntu-kernel.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        copy = subprocess.run(["cp", "-al", str(kernel), str(staging)], check=False)
        if copy.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            subprocess.run(["cp", "-a", str(kernel), str(staging)], check=True)
        staging.rename(ubuntu)
    return dest
