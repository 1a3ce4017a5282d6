"""GRUB defaults read as update-grub sources them (fixture sources: tests/fixtures/grub/README.md)."""

import subprocess

import pytest

from gpuhost.plan.boot.grub import (
    DEFAULTS,
    DROPIN,
    DROPIN_DIR,
    LINUX,
    LINUX_DEFAULT,
    GrubConfigError,
    parse_grub_defaults,
    render_dropin,
    sourced_files,
)
from tests.unit.conftest import FIXTURES

GRUB = FIXTURES / "grub"
STOCK = (GRUB / "debian-bookworm.grub").read_text()


def grub(text: str, **dropins: str) -> dict[str, str]:
    return {DEFAULTS: text, **{f"{DROPIN_DIR}/{name}": body for name, body in dropins.items()}}


def origins(files: dict[str, str]) -> dict[str, str]:
    return {p.value: p.origin for p in parse_grub_defaults(files).normal}


def test_debian_stock_file() -> None:
    cmdline = parse_grub_defaults(grub(STOCK))
    assert cmdline.values(LINUX_DEFAULT) == ["quiet"] and cmdline.values(LINUX) == []
    assert cmdline.linux_default[0].origin == f"{DEFAULTS}:9"


def test_proxmox_zfs_install_appends_in_dropins() -> None:
    files = grub(
        STOCK,
        **{
            "zfs.cfg": (GRUB / "proxmox-zfs.cfg").read_text(),
            "installer.cfg": (GRUB / "proxmox-installer.cfg").read_text(),
        },
    )
    cmdline = parse_grub_defaults(files)
    # installer.cfg sorts before zfs.cfg: both append to GRUB_CMDLINE_LINUX
    assert [p.value for p in cmdline.recovery] == [
        "console=ttyS0,115200",
        "root=ZFS=rpool/ROOT/pve-1",
        "boot=zfs",
    ]
    assert [p.value for p in cmdline.normal][-1] == "quiet"
    assert origins(files)["boot=zfs"] == f"{DROPIN_DIR}/zfs.cfg:1"
    assert origins(files)["console=ttyS0,115200"] == f"{DROPIN_DIR}/installer.cfg:4"


def test_comment_after_value_keeps_the_value() -> None:
    # issue failure (a): a comment after the value must not eat "quiet splash"
    cmdline = parse_grub_defaults(grub('GRUB_CMDLINE_LINUX_DEFAULT="quiet splash" # my comment\n'))
    assert cmdline.values(LINUX_DEFAULT) == ["quiet", "splash"]


def test_single_quotes_are_read() -> None:
    # issue failure (b): a single-quoted value carries intel_iommu=off
    files = grub("GRUB_CMDLINE_LINUX='console=ttyS0 intel_iommu=off'\n")
    assert parse_grub_defaults(files).values(LINUX) == ["console=ttyS0", "intel_iommu=off"]
    assert origins(files)["intel_iommu=off"] == f"{DEFAULTS}:1"


def test_shell_forms() -> None:
    text = "\n".join(
        [
            "GRUB_CMDLINE_LINUX=nomodeset  # unquoted",
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet"',
            'export GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} iommu=pt"',
            "GRUB_CMDLINE_LINUX=$GRUB_CMDLINE_LINUX' pci=realloc'\"\"",
            "  # an indented comment",
            'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT \\',
            '  amd_iommu=force_isolation"',
            "export GRUB_CMDLINE_LINUX",
            "GRUB_TIMEOUT=5 GRUB_DEFAULT=0",
            "GRUB_GFXMODE=auto#no-comment-inside-a-word",
        ]
    )
    files = grub(text)
    cmdline = parse_grub_defaults(files)
    assert cmdline.values(LINUX) == ["nomodeset", "pci=realloc"]
    assert cmdline.values(LINUX_DEFAULT) == ["quiet", "iommu=pt", "amd_iommu=force_isolation"]
    found = origins(files)
    assert found["quiet"] == f"{DEFAULTS}:2" and found["iommu=pt"] == f"{DEFAULTS}:3"
    assert found["amd_iommu=force_isolation"] == f"{DEFAULTS}:6"  # a continued line: its start


def test_last_assignment_wins_across_files() -> None:
    files = grub(
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n',
        **{"50-cloud.cfg": 'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1"\n'},
    )
    cmdline = parse_grub_defaults(files)
    assert cmdline.values(LINUX_DEFAULT) == ["console=tty1"]


def test_only_cfg_dropins_in_sorted_order() -> None:
    paths = [f"{DROPIN_DIR}/b.cfg", f"{DROPIN_DIR}/a.cfg", f"{DROPIN_DIR}/x.bak", DEFAULTS]
    paths += [f"{DROPIN_DIR}/.hidden.cfg", "/etc/kernel/cmdline"]
    assert sourced_files(paths) == [DEFAULTS, f"{DROPIN_DIR}/a.cfg", f"{DROPIN_DIR}/b.cfg"]


def test_other_variables_may_use_the_shell() -> None:
    # Debian's own GRUB_DISTRIBUTOR is a command substitution; it cannot touch the command line
    text = 'GRUB_DISTRIBUTOR=$(. /etc/os-release; echo "$NAME")\nGRUB_RECORDFAIL_TIMEOUT=$X\n'
    assert parse_grub_defaults(grub(text)).normal == ()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('GRUB_CMDLINE_LINUX="`cat /etc/cmdline`"', "command substitution"),
        ('GRUB_CMDLINE_LINUX="$(cat /etc/cmdline)"', "command substitution"),
        ('GRUB_CMDLINE_LINUX="$EXTRA quiet"', r"expansion \$EXTRA"),
        ('GRUB_CMDLINE_LINUX="${EXTRA:-quiet}"', "expansion"),
        ('GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX}x"', "glues"),
        ('if true; then GRUB_CMDLINE_LINUX="a"; fi', "inside the if block"),
        ("if [ -e /x ]\nthen", "no fi"),
        ("if . /etc/x; then GRUB_TIMEOUT=1; fi", "can set variables"),
        ('[ -e /x ] && GRUB_CMDLINE_LINUX="a"', "operator '&'"),
        (". /etc/default/extra", "command"),
        ('GRUB_CMDLINE_LINUX="quiet', "unterminated"),
        ('GRUB_CMDLINE_LINUX="dyndbg=\\"file x\\""', "quotes"),
    ],
)
def test_refuses_what_it_cannot_evaluate(text: str, why: str) -> None:
    with pytest.raises(GrubConfigError, match=why) as info:
        parse_grub_defaults(grub("GRUB_DEFAULT=0\n" + text + "\n"))
    assert info.value.origin == f"{DEFAULTS}:2" and "won't guess" in str(info.value)


def test_dropin_is_read_back_and_attributed() -> None:
    params = ["intel_iommu=on", "iommu=pt", "pcie_acs_override=downstream,multifunction"]
    files = grub(STOCK, **{"zfs.cfg": (GRUB / "proxmox-zfs.cfg").read_text()})
    files[DROPIN] = render_dropin(params)
    cmdline = parse_grub_defaults(files)
    assert cmdline.from_dropin() == params
    assert [p.value for p in cmdline.recovery][-3:] == params  # recovery entries get them too
    assert origins(files)["iommu=pt"] == f"{DROPIN}:5"
    assert sourced_files(list(files))[-1] == DROPIN  # sourced after Proxmox's zfs.cfg


def test_dropin_quotes_what_the_shell_would_interpret() -> None:
    text = render_dropin(["a*b", "c;d"])
    assert "'a*b'" in text and "'c;d'" in text
    with pytest.raises(ValueError):
        render_dropin(['x="y z"'])
    with pytest.raises(ValueError):
        render_dropin(["$(reboot)"])


def test_dropin_means_the_same_to_sh(tmp_path) -> None:
    # sh itself agrees with the reader on the rendered file
    dropin = tmp_path / "gpuhost.cfg"
    dropin.write_text(render_dropin(["intel_iommu=on", "a*b"]))
    out = subprocess.run(
        ["sh", "-c", f'GRUB_CMDLINE_LINUX="root=x"; . {dropin}; printf %s "$GRUB_CMDLINE_LINUX"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "root=x intel_iommu=on a*b"


def test_reader_agrees_with_sh(tmp_path) -> None:
    # the shell forms above, the stock file and Proxmox's drop-ins: sh sources them as
    # grub-mkconfig does and prints both variables; the reader must say the same
    text = "\n".join(
        [
            STOCK,
            "GRUB_CMDLINE_LINUX=nomodeset  # unquoted",
            'export GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} iommu=pt" # c',
            "GRUB_CMDLINE_LINUX=$GRUB_CMDLINE_LINUX' pci=realloc'\"\"",
            'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT \\',
            '  amd_iommu=force_isolation"',
            "if [ -d /nonexistent ]; then GRUB_TERMINAL=serial; else GRUB_TIMEOUT=3; fi",
            'GRUB_TIMEOUT=5; GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX nosmt"',
        ]
    )
    files = grub(text, **{"zfs.cfg": (GRUB / "proxmox-zfs.cfg").read_text()})
    files[DROPIN] = render_dropin(["intel_iommu=on"])
    for path, body in files.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    script = "; ".join(f". {tmp_path / p.lstrip('/')}" for p in sourced_files(list(files)))
    script += '; printf "%s\\n%s\\n" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    linux, default = out.stdout.splitlines()
    cmdline = parse_grub_defaults(files)
    assert (
        cmdline.values(LINUX) == linux.split() and cmdline.values(LINUX_DEFAULT) == default.split()
    )


IF_BLOCK = """\
GRUB_DEFAULT=0
if [ -d /sys/firmware/efi ]; then
    GRUB_TERMINAL=console
elif ! test -e /etc/serial; then GRUB_TIMEOUT=3
else
    GRUB_TERMINAL=serial; GRUB_SERIAL_COMMAND="serial --unit=0"
fi
GRUB_CMDLINE_LINUX_DEFAULT="quiet"
"""


def test_an_if_block_that_sets_other_variables_is_read() -> None:
    cmdline = parse_grub_defaults(grub(IF_BLOCK))
    assert [(p.value, p.origin) for p in cmdline.normal] == [("quiet", f"{DEFAULTS}:8")]


def test_a_conditional_command_line_is_refused_with_the_way_out_and_the_way_works() -> None:
    conditional = IF_BLOCK.replace("GRUB_TERMINAL=console", 'GRUB_CMDLINE_LINUX="nomodeset"')
    with pytest.raises(GrubConfigError) as info:
        parse_grub_defaults(grub(conditional))
    message = str(info.value)
    assert message.startswith(f"{DEFAULTS}:3: GRUB_CMDLINE_LINUX is set inside the if block of ")
    assert "set it outside the block, unconditionally" in message
    # as it says: the assignment out of the block (the block keeps its other settings)
    fixed = conditional.replace('    GRUB_CMDLINE_LINUX="nomodeset"\n', "")
    fixed = 'GRUB_CMDLINE_LINUX="nomodeset"\n' + fixed
    assert parse_grub_defaults(grub(fixed)).values(LINUX) == ["nomodeset"]


def test_a_command_is_refused_with_what_to_write_instead() -> None:
    with pytest.raises(GrubConfigError) as info:
        parse_grub_defaults(grub(". /etc/default/extra\n"))
    message = str(info.value)
    assert "write what it sets as plain assignments instead" in message
    assert f"{DROPIN_DIR}/<name>.cfg" in message and DROPIN in message
