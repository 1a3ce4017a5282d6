"""Run a VM image in QEMU under TCG: OVMF, a qcow2 overlay, SSH on a loopback port.

    with Vm.start(image, workdir) as vm:
        vm.wait_ssh(300)
        vm.ssh("cat /proc/cmdline").stdout

Each VM lives in its workdir: disk.qcow2 (an overlay of the cached image), OVMF_VARS.fd (its own
NVRAM, which keeps EFI variables across the reboots of one QEMU process), console.log (the
serial console, written by QEMU itself), console.sock (the console's input), qemu.log, and the
known_hosts and ssh_config that reach it with host-key checking on.

A reboot is a power cycle: QEMU runs with -no-reboot, and when the guest resets the machine (the
kernel's reboot, SysRq, a panic's timeout, GRUB's or the firmware's reset) the runner starts QEMU
again on the same disk, NVRAM and port, so the firmware, the loader and the kernel run again as
on a host. A warm reset in one QEMU process was seen to keep OVMF busy for 1 to 12 minutes after
a deploy had run in the guest (the vCPU thread sampled in page_collection_lock under
helper_le_stq_mmu: TCG apparently invalidating the old system's translated code as the firmware
wrote over it), while a fresh QEMU reaches GRUB in seconds. The guest powering off ends the VM.

TCG, not KVM: /dev/kvm on these machines was measured too slow to reach userspace (docs/development.md,
"What the development machines are proven to do").
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from twin.vm.image import BIOS_LAYOUTS, VmImage, client_key

OVMF = Path("/usr/share/OVMF")
QEMU = "qemu-system-x86_64"
# A bound for one boot's waits: QEMU start to SSH takes about 45 s under TCG on 2 idle cores;
# the rest is room for a loaded CI machine running several VMs.
BOOT_TIMEOUT = 600
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\r")


class VmError(RuntimeError):
    """A VM did not do what was waited for; the message ends with its last console lines."""


def missing() -> list[str]:
    """What the machine lacks to run VMs (empty when it has it all): for a test's skip reason."""
    lack = [t for t in (QEMU, "qemu-img", "ssh") if not shutil.which(t)]
    lack += [
        str(OVMF / f) for f in ("OVMF_CODE_4M.fd", "OVMF_VARS_4M.fd") if not (OVMF / f).exists()
    ]
    return lack


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _popen(argv: list[str], workdir: Path) -> subprocess.Popen[bytes]:
    with open(workdir / "qemu.log", "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent
        )


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a test run that dies takes its VMs with it instead of leaving them running.
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


@dataclass
class Vm:
    image: VmImage
    workdir: Path
    port: int
    proc: subprocess.Popen[bytes]
    cursor: int = 0  # where the next wait_console looks from by default: after the last match
    argv: list[str] = field(default_factory=list)
    restarts: int = 0  # the guest's resets so far, each a fresh QEMU process
    ended: int | None = None  # QEMU's exit status once the VM is over (power-off or failure)
    _stopping: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(
        cls,
        image: VmImage,
        workdir: Path,
        *,
        secure_boot: bool = False,
        iommu: Literal["intel", "amd"] | None = "intel",
        extra: Sequence[str] = (),
        memory_mb: int = 1024,
        smp: int = 1,  # on 2 shared cores one vCPU boots faster and costs half the host CPU
    ) -> Vm:
        """Boot image on a fresh overlay in workdir; returns once QEMU runs (not booted yet)."""
        workdir.mkdir(parents=True, exist_ok=True)
        disk, vars_fd = workdir / "disk.qcow2", workdir / "OVMF_VARS.fd"
        disk.unlink(missing_ok=True)
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", image.path, disk],
            check=True,
        )
        ms = ".ms" if secure_boot else ""  # Microsoft's keys enrolled: shim-signed boots
        bios = image.layout in BIOS_LAYOUTS  # SeaBIOS, QEMU's default firmware: no pflash
        if not bios:
            shutil.copy(OVMF / f"OVMF_VARS_4M{ms}.fd", vars_fd)
        machine = "q35" + (",smm=on" if secure_boot else "")
        # intremap needs a split irqchip under KVM; TCG ignores the property, so it is harmless.
        machine += ",kernel-irqchip=split" if iommu == "intel" else ""
        sock = workdir / "console.sock"
        if len(str(sock)) > 100:  # sun_path holds 108 bytes
            raise VmError(f"workdir path too long for the console socket: {sock}")
        # The console is a socket chardev with a logfile rather than -serial file:, so a test can
        # also type on it (rescue mode's "Press Enter to continue"); the log records all output.
        # The CPU's vendor goes with the IOMMU, as on real boards: gpuhost plans intel_iommu=on
        # for an Intel CPU (TCG's `max` CPU is AuthenticAMD by default).
        cpu = "max,vendor=GenuineIntel" if iommu == "intel" else "max"
        argv = [QEMU, "-accel", "tcg", "-machine", machine, "-cpu", cpu]
        argv += ["-m", str(memory_mb), "-smp", str(smp), "-nographic"]
        # No default VGA, CD-ROM, parallel port or monitor: fewer devices for the firmware and
        # the kernel to probe under TCG (QEMU start to SSH: 45 s -> 39 s with one vCPU).
        argv += ["-nodefaults"]
        argv += [
            "-chardev",
            f"socket,id=con,path={sock},server=on,wait=off,logfile={workdir}/console.log,"
            "logappend=on",
        ]
        argv += ["-serial", "chardev:con", "-no-reboot"]  # a reset restarts QEMU (see above)
        if not bios:
            argv += [
                "-drive",
                f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF}/OVMF_CODE_4M{ms}.fd",
            ]
            argv += ["-drive", f"if=pflash,format=raw,unit=1,file={vars_fd}"]
        if secure_boot:
            argv += ["-global", "driver=cfi.pflash01,property=secure,value=on"]
        if iommu:  # before the other PCI devices, so they sit behind it
            argv += ["-device", "intel-iommu,intremap=on" if iommu == "intel" else "amd-iommu"]
        argv += ["-drive", f"file={disk},if=none,id=disk0,format=qcow2,cache=unsafe,discard=unmap"]
        argv += ["-device", "virtio-blk-pci,drive=disk0,bootindex=0"]
        argv += [*extra]
        for _attempt in range(5):  # another process can take the free port before QEMU binds it
            port = free_port()
            net = ["-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{port}-:22"]
            net += ["-device", "virtio-net-pci,netdev=net0"]
            vm = cls._spawn(image, workdir, port, argv + net)
            if vm is not None:
                return vm
        raise VmError(f"QEMU could not forward a port: {(workdir / 'qemu.log').read_text()[-800:]}")

    @classmethod
    def _spawn(cls, image: VmImage, workdir: Path, port: int, argv: list[str]) -> Vm | None:
        """Start QEMU; None when its port forward failed (try another port)."""
        console = workdir / "console.log"
        console.unlink(missing_ok=True)
        (workdir / "qemu.log").unlink(missing_ok=True)
        proc = _popen(argv, workdir)
        vm = cls(image, workdir, port, proc, argv=argv)
        vm._write_ssh_files()
        deadline = time.monotonic() + 60
        # The firmware's first console output comes after the machine (and its netdev, whose
        # port forward is the thing that can fail) is set up.
        while proc.poll() is None and time.monotonic() < deadline:
            if console.exists() and console.stat().st_size > 0:
                threading.Thread(target=vm._supervise, daemon=True).start()
                return vm
            time.sleep(0.1)
        if proc.poll() is None:
            vm.kill()
            raise VmError(f"QEMU started but wrote nothing to {console} in 60 s")
        text = (workdir / "qemu.log").read_text(errors="replace")
        if "host forwarding" in text:
            return None
        raise VmError(f"QEMU exited ({proc.returncode}): {text[-800:]}\n$ {' '.join(argv)}")

    def _supervise(self) -> None:
        """Follow the guest's resets: start QEMU again whenever it exits for one (see above).
        The thread that starts a QEMU stays until it exits (PR_SET_PDEATHSIG is per thread)."""
        while True:
            rc = self.proc.wait()
            with self._lock:
                if self._stopping:
                    return
                if rc != 0 or self._powered_off():
                    self.ended = rc
                    return
                self.proc = _popen(self.argv, self.workdir)
                self.restarts += 1

    def _powered_off(self) -> bool:
        """Whether the guest's kernel powered the machine off: its last console line says so
        (kernel/reboot.c, kernel_power_off); every other exit under -no-reboot is a reset."""
        path = self.workdir / "console.log"
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 400))
            tail = f.read().decode("latin-1")
        return ANSI.sub("", tail).rstrip().endswith("reboot: Power down")

    def _over(self) -> str | None:
        """Why the VM is over (QEMU exited for good), None while it runs or restarts."""
        return None if self.ended is None else f"QEMU exited ({self.ended})"

    def _write_ssh_files(self) -> None:
        (self.workdir / "known_hosts").write_text(self.image.known_hosts_line(self.port))
        (self.workdir / "ssh_config").write_text(
            f"Host vm\n  HostName 127.0.0.1\n  Port {self.port}\n  User root\n"
            f"  IdentityFile {client_key()}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.workdir}/known_hosts\n  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n  ConnectTimeout 10\n  LogLevel ERROR\n"
        )

    @property
    def host_data(self) -> dict[str, object]:
        """pyinfra host data reaching this VM (host-key checking on)."""
        return {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": self.port,
            "ssh_user": "root",
            "ssh_key": str(client_key()),
            "ssh_known_hosts_file": str(self.workdir / "known_hosts"),
            "ssh_strict_host_key_checking": "yes",
        }

    # -- the console -------------------------------------------------------------------------

    def console_text(self) -> str:
        """The raw console log; latin-1 keeps one character per byte, so offsets are bytes."""
        path = self.workdir / "console.log"
        return path.read_bytes().decode("latin-1") if path.exists() else ""

    def console_offset(self) -> int:
        path = self.workdir / "console.log"
        return path.stat().st_size if path.exists() else 0

    def tail(self, lines: int = 40) -> str:
        raw = self.console_text().encode("latin-1").decode("utf-8", errors="replace")
        return "\n".join(ANSI.sub("", raw).splitlines()[-lines:])

    def fail(self, what: str) -> VmError:
        return VmError(
            f"{what}\n--- last console lines ({self.workdir}/console.log) ---\n{self.tail()}"
        )

    def wait_console(self, pattern: str, timeout: float, since: int | None = None) -> re.Match[str]:
        """The first match of pattern in the console after since (default: after the last
        match); polls the log QEMU writes. Raises VmError on timeout or when QEMU exits."""
        rx = re.compile(pattern)
        start = self.cursor if since is None else since
        deadline = time.monotonic() + timeout
        while True:
            found = rx.search(self.console_text(), start)
            if found:
                self.cursor = found.end()
                return found
            if self._over():
                raise self.fail(f"{self._over()} before {pattern!r} showed")
            if time.monotonic() > deadline:
                raise self.fail(f"{pattern!r} not on the console after {timeout:.0f} s")
            time.sleep(0.2)

    def send_console(self, text: str) -> None:
        """Type text on the serial console (connect, send, hang up: a connected client that
        does not read would stall the guest's console output)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.workdir / "console.sock"))
            s.sendall(text.encode())

    # -- SSH ---------------------------------------------------------------------------------

    def ssh(
        self, command: str, *, check: bool = True, timeout: float = 300, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run command as root over OpenSSH (the client key, this VM's known_hosts, BatchMode)."""
        argv = ["ssh", "-F", str(self.workdir / "ssh_config"), "vm", command]
        try:
            done = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise self.fail(f"ssh {command!r} did not finish in {timeout:.0f} s") from None
        if check and done.returncode != 0:
            raise self.fail(f"ssh {command!r} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def wait_ssh(self, timeout: float) -> None:
        """Until a command runs over SSH (sshd up, host key verified)."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.ssh("true", check=False, timeout=30)
            if done.returncode == 0:
                return
            if self._over():
                raise self.fail(f"{self._over()} before SSH answered")
            if time.monotonic() > deadline:
                raise self.fail(f"no SSH after {timeout:.0f} s: {done.stderr.strip()}")
            time.sleep(1)

    def reboot(self, timeout: float = 600) -> int:
        """systemctl reboot, then wait for the next kernel and SSH. Returns the console offset
        where the reboot began, for wait_console(..., since=) on what the boot showed."""
        start = self.console_offset()
        self.ssh("systemctl reboot", check=False, timeout=30)  # the connection may drop: 255
        self.wait_console(r"Linux version \d", timeout, since=start)
        self.wait_ssh(timeout)
        return start

    # -- stopping ----------------------------------------------------------------------------

    def stop(self, timeout: float = 60) -> None:
        """Power off over SSH and wait (bounded), then kill whatever is still running."""
        with self._lock:
            self._stopping = True  # no restart from here on
        if self.proc.poll() is None:
            with contextlib.suppress(VmError):
                self.ssh("systemctl poweroff", check=False, timeout=15)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()

    def kill(self) -> None:
        with self._lock:
            self._stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Vm:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
