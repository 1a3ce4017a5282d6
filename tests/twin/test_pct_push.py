"""`pct push` on a Proxmox twin opens a relative source in the caller's working directory.

pve-container src/PVE/CLI/pct.pm, push: `sysopen my $srcfd, $file, O_RDONLY` in pct's own
process, before it enters the container's namespaces, so `pct push 300 a.run /root/a.run` run in
/root pushes /root/a.run (the audit's userspace advice is written that way).
"""

from __future__ import annotations

from twin.pytest_plugin import PVE_DIRS

twin_profile = "lumped"
CONF = "arch: amd64\nhostname: ct300\nostype: debian\nunprivileged: 1\n"


def test_pct_push_reads_a_relative_source_from_the_callers_directory(twin) -> None:
    rc, _, err = twin.run(f"{PVE_DIRS}; printf '{CONF}' > /etc/pve/lxc/300.conf && pct start 300")
    assert rc == 0, err
    try:
        push = "cd /root && echo pushed > rel.txt && pct push 300 rel.txt /root/rel.txt"
        rc, _, err = twin.run(push)
        assert rc == 0, err
        assert twin.run("pct exec 300 -- cat /root/rel.txt")[:2] == (0, "pushed\n")
        rc, _, err = twin.run("cd / && pct push 300 rel.txt /root/rel.txt")
        assert (rc, err) == (255, "failed to open /rel.txt for reading\n")
    finally:
        twin.run("pct stop 300")
