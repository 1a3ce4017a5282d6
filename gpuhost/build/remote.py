"""The kernel build as a build host runs it (artifacts.build_host): `gpuhost build` uploads this
module with the ones it imports and runs

    python3 -m gpuhost.build.remote <request as base64 JSON>

there, over SSH. Standard library only: a build host needs python3 and the kernel's build
dependencies, not gpuhost's. Everything the build depends on is read on the build host itself:
the tree (cloned there from a git URL), the base config file, the compiler binary the inputs
hash covers, and its cores and MemAvailable for the jobs rule. The build is gpuhost's own
(gpuhost.build.kernel.build), into the store at the request's path there.

Prints one JSON line: the stored artifact (and whether it was already there), or the refusal.
"""

from __future__ import annotations

import base64
import json
import shutil
import sys
import tempfile
from pathlib import Path

from gpuhost.build.artifacts import ArtifactError, ArtifactStore
from gpuhost.build.kernel import KernelBuildError, KernelRecipe, local_jobs, source_tree
from gpuhost.build.kernelbuild import build

# What the control machine uploads beside this module (the package needs no more to build).
MODULES = (
    "__init__.py",
    "spec/__init__.py",
    "spec/grammar.py",
    "build/__init__.py",
    "build/artifacts.py",
    "build/kernel.py",
    "build/kernelbuild.py",
    "build/pvekernel.py",
    "build/features.py",
    "build/debinfo.py",
    "build/remote.py",
    "observe/__init__.py",
    "observe/parse.py",
    "observe/probe.py",
    "observe/zfs.py",
)


def encode(request: dict) -> str:
    return base64.b64encode(json.dumps(request, sort_keys=True).encode()).decode()


def decode(text: str) -> dict:
    return json.loads(base64.b64decode(text.encode(), validate=True))


def serve(request: dict) -> dict:
    """Build the request's kernel into the store it names; the answer as a JSON-ready dict."""
    store = ArtifactStore(request["store"])
    scratch = Path(tempfile.mkdtemp(prefix="gpuhost-build-", dir=request.get("work") or "/var/tmp"))
    try:
        tree = source_tree(request["repo"], request["ref"], scratch)
        recipe = KernelRecipe(tree=tree, **request["recipe"])
        jobs = request.get("jobs") or local_jobs()
        result = build(recipe, store, scratch / "out", jobs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    artifact = result.artifact
    return {
        "ok": True,
        "cached": result.cached,
        "directory": str(artifact.directory),
        "key": artifact.key.__dict__,
        "files": artifact.files,
        "jobs": None if result.cached else jobs,
    }


def main(argv: list[str]) -> int:
    try:
        answer = serve(decode(argv[0]))
    except (KernelBuildError, ArtifactError, OSError) as exc:
        answer = {"ok": False, "error": str(exc)}
    print(json.dumps(answer, sort_keys=True), flush=True)
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
