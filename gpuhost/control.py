"""Read, on the control machine, what a run may need from it (gpuhost/plan/preconditions.py decides
which of it the run needs): the API token, the driver's files and tree, the artifact stores.

Read before planning, by the deploy (deploys/context.py) and `gpuhost plan`, so a missing file
is refused before the first change instead of being found halfway. Nothing here changes
anything; the build host is connected to (and its store's manifests listed) only when the run
installs the kernel from it. No secret is kept: the token is parsed and dropped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuhost.build.artifacts import ArtifactError, ArtifactStore
from gpuhost.build.driverstore import DriverModulesError, check_tree, modules_key
from gpuhost.build.host import BuildHostError
from gpuhost.build.kernelstore import KernelStoreError, stored_key
from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.driver.modules import MODULES_KIND, plan_driver_modules
from gpuhost.plan.preconditions import ControlFacts, kernel_from_store
from gpuhost.pve.token import ApiTokenError, read_token
from gpuhost.spec.host import HostSpec


def file_problem(path: str, field: str) -> str | None:
    """None when ``path`` is a regular file this user can read."""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except IsADirectoryError:
        return f"{path} is a directory; point {field} at the file"
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror}); put the file there, or fix {field}"
    return None


def _token(spec: HostSpec, environ: Mapping[str, str] | None) -> str | None:
    try:
        read_token(spec.proxmox, environ)
    except ApiTokenError as exc:
        return str(exc)
    return None


def _kernel_store(spec: HostSpec, source: str | None) -> str | None:
    from gpuhost.build.remotestore import store_for  # connects to a build host: only when needed

    try:
        store = store_for(spec.artifacts, source or "")
        stored_key(store, spec.kernel.version, spec.toolchain.gcc)
    except (KernelStoreError, ArtifactError, BuildHostError) as exc:
        return str(exc)
    except (OSError, ValueError) as exc:  # the inventory cannot be read again, say
        return f"{type(exc).__name__}: {exc}"
    return None


def read_control(
    spec: HostSpec,
    facts: HostFacts,
    source: str | None,
    environ: Mapping[str, str] | None = None,
) -> ControlFacts:
    """What the control machine shows for ``spec`` on a host showing ``facts``.

    + source: the inventory file (it declares the build host)
    + environ: the environment the token may be in (default: this process's)
    """
    files: dict[str, str | None] = {}
    tree, stored = None, False
    driver = spec.driver.source
    if driver is not None:
        for name in ("installer", "fabricmanager"):
            path = getattr(driver, name)
            if path is not None:
                files[path] = file_problem(path, f"driver.source.{name}")
        modules = plan_driver_modules(spec, facts)
        if modules is not None:
            try:
                keys = ArtifactStore(modules.store).keys(
                    MODULES_KIND, modules.version, modules.kernel
                )
            except (ArtifactError, OSError, ValueError):  # an unreadable manifest
                keys = []
            key = modules_key(modules)
            stored = (key in keys) if key is not None else bool(keys)
            try:
                check_tree(modules)
            except (DriverModulesError, OSError) as exc:
                tree = str(exc)
    return ControlFacts(
        token=_token(spec, os.environ if environ is None else environ),
        files=files,
        tree=tree,
        modules_stored=stored,
        kernel_store=_kernel_store(spec, source) if kernel_from_store(spec, facts) else None,
    )
