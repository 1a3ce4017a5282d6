"""The live rebind: the board-state fact's parser, refusals that name the holder, the script."""

from __future__ import annotations

import pytest

from deploys.rebind import rebind_script, refusal
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.rebind import BoardBinding, Holder, parse_board_state

BOARD = ("0000:c1:00.0", "0000:c1:00.1")
# As the fact's command prints it on a host where CT 200 runs CUDA on the GPU (minor 6).
LINES = [
    "F 0000:c1:00.0 nvidia - 30 6",
    "F 0000:c1:00.1 snd_hda_intel - 30 -",
    "H c3:6 2211 nvidia-persiste 0::/system.slice/gpuhost-nvidia-persistenced.service ",
    "H c3:6 4242 python3 0::/lxc/200/ns/user.slice ",
    "P 00000000:01:00.0, Enabled",
    "P 00000000:C1:00.0, Enabled",
    "A 00000000:C1:00.0, 4242, python3",
]


def test_the_fact_reads_functions_holders_and_persistence() -> None:
    state = parse_board_state(LINES)
    assert state.functions["0000:c1:00.0"].driver == "nvidia"
    assert state.functions["0000:c1:00.0"].minor == 6
    assert state.functions["0000:c1:00.1"].minor is None
    assert state.holders[1] == Holder(4242, "python3", "195:6", "CT 200")
    assert state.holders[0].guest is None
    assert state.persistence == {"0000:01:00.0": True, "0000:c1:00.0": True}
    assert state.compute_apps == [("0000:c1:00.0", 4242, "python3")]
    with pytest.raises(UnparsedOutput):
        parse_board_state(["F 0000:c1:00.0 nvidia"])


def test_the_fact_command_only_takes_pci_addresses() -> None:
    assert "for b in 0000:c1:00.0 0000:c1:00.1; do" in BoardBinding().command(BOARD)
    with pytest.raises(ValueError, match="is not a PCI address"):
        BoardBinding().command(("0000:c1:00.0;reboot",))


def test_a_gpu_in_use_is_refused_naming_the_process_and_guest() -> None:
    why = refusal(parse_board_state(LINES), BOARD, "vfio-pci")
    assert why is not None
    assert why.startswith("GPU 0000:c1:00.0 is in use by pid 4242 (python3, CT 200)")
    assert "2211" not in why  # nvidia-persistenced is released, not a reason to refuse


def test_only_nvidia_persistenced_holding_is_released_not_refused() -> None:
    state = parse_board_state([line for line in LINES if "4242" not in line])
    assert refusal(state, BOARD, "vfio-pci") is None
    script = rebind_script(state, BOARD, "vfio-pci", 10)
    assert "nvidia-smi -i 0000:c1:00.0 -pm 0" in script
    assert "grep -c '^c3:6 '" in script  # held again since the fact was read: stop
    assert script.index("-pm 0") < script.index("/unbind")
    assert "modprobe vfio-pci" in script


def test_a_running_vm_blocks_the_move_back() -> None:
    lines = [
        "F 0000:c1:00.0 vfio-pci vfio-pci 30 -",
        "F 0000:c1:00.1 vfio-pci vfio-pci 30 -",
        "H f1:0 5150 kvm 0::/qemu.slice/129.scope ",
    ]
    why = refusal(parse_board_state(lines), BOARD, "nvidia")
    assert why == (
        "GPU 0000:c1:00.0 is in use through vfio by pid 5150 (kvm, VM 129): stop the VM first"
    )
    script = rebind_script(parse_board_state(lines[:2]), BOARD, "nvidia", 5)
    assert 'echo "" > "$d/driver_override"' in script and "nvidia-modprobe -c" in script
    assert "-pm 1" not in script  # no GPU of the host is in persistence mode


def test_the_board_returns_into_persistence_mode_where_the_others_are() -> None:
    lines = [
        "F 0000:c1:00.0 vfio-pci vfio-pci 30 -",
        "F 0000:c1:00.1 vfio-pci vfio-pci 30 -",
        "P 00000000:01:00.0, Enabled",
    ]
    state = parse_board_state(lines)
    assert state.persistence == {"0000:01:00.0": True}
    script = rebind_script(state, BOARD, "nvidia", 5)
    assert "if ! nvidia-smi -i 0000:c1:00.0 -pm 1 >/dev/null 2>&1; then" in script
    assert script.index("nvidia-modprobe -c") < script.index("-pm 1")
    # a daemon that does not know the GPU is restarted through its unit, then asked again
    assert 'systemctl restart "$unit"' in script
    assert script.rstrip().endswith("nvidia-smi -i 0000:c1:00.0 -pm 1 >/dev/null || exit 1\nfi")


def test_the_move_back_resets_first_and_refuses_a_function_that_does_not_answer() -> None:
    lines = [
        "F 0000:c1:00.0 vfio-pci vfio-pci 30 -",
        "C 0000:c1:00.0 10de",
        "F 0000:c1:00.1 vfio-pci vfio-pci 30 -",
        "C 0000:c1:00.1 10de",
    ]
    state = parse_board_state(lines)
    assert state.config_vendor == {"0000:c1:00.0": "10de", "0000:c1:00.1": "10de"}
    assert refusal(state, BOARD, "nvidia") is None
    script = rebind_script(state, BOARD, "nvidia", 5)
    # the reset and the read-back come before the override is cleared and vfio-pci lets go
    assert script.index('echo 1 > "$d/reset"') < script.index('od -An -tx2 -N2 "$d/config"')
    assert script.index('od -An -tx2 -N2 "$d/config"') < script.index('> "$d/driver_override"')
    lost = parse_board_state([*lines[:3], "C 0000:c1:00.1 ffff"])
    assert refusal(lost, BOARD, "nvidia") == (
        "0000:c1:00.1: config space reads back ffff (vendor id 0xffff: the function does not "
        "answer): not binding nvidia; the board stays on vfio-pci; power-cycle the host to "
        "recover it"
    )
    with pytest.raises(UnparsedOutput):
        parse_board_state(["C 0000:c1:00.0 zz"])
