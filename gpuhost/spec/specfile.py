"""A host's validated spec as a JSON file: what `gpuhost metrics --local --spec FILE` audits the
host against (the deploy writes it to /etc/gpuhost/spec.json on the host it provisions).

The file holds no secret: an environment value whose name reads as a secret (TOKEN, PASSWORD,
SECRET, ... gpuhost/redact.py) is replaced by :data:`REDACTED`. The checks that compare those
values (``ct.environment``, ``ct.services``) cannot be judged from such a file; the metrics
report them as not applicable for that guest, naming why (:func:`redacted_guests`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuhost.redact import is_secret_name
from gpuhost.spec.errors import describe
from gpuhost.spec.host import HostSpec

REDACTED = "gpuhost-redacted"  # a valid env value (spec/values.py) that no deploy writes
# Checks whose expectation contains the guest's environment values.
ENV_CHECKS = frozenset({"ct.environment", "ct.services"})


class SpecFileError(ValueError):
    """A spec file that is not a valid host spec: every problem, naming the file and the field.
    (Not gpuhost.spec.validate's SpecError: that one is pyinfra's, and the host's metrics
    runtime has no pyinfra.)"""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source, self.problems = source, problems
        lines = [f"{source}: invalid gpuhost spec ({len(problems)} problem(s))"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


def _redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def dump_spec(spec: HostSpec) -> str:
    """The spec as JSON (sorted keys, one trailing newline), secret-named env values redacted."""
    data: dict[str, Any] = spec.model_dump(mode="json")
    for guest in data.get("guests", []):
        guest["env"] = _redact_env(guest.get("env") or {})
        for venv in guest.get("venvs") or []:
            venv["env"] = _redact_env(venv.get("env") or {})
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def load_spec(path: str | Path) -> HostSpec:
    """The spec in ``path`` (written by :func:`dump_spec`); a clear error naming the file, the
    field and the fix when it cannot be read or is not a valid spec."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FileNotFoundError(
            f"{source}: cannot read the host spec ({exc.strerror}); the deploy writes it when "
            "the spec asks for monitoring, or write one with gpuhost.spec.specfile.dump_spec"
        ) from None
    try:
        return HostSpec.model_validate_json(text)
    except ValidationError as exc:
        raise SpecFileError(source, describe(exc)) from None


def redacted_guests(spec: HostSpec) -> set[str]:
    """Names of the guests whose environment (or a venv's) holds a redacted value."""
    out = set()
    for guest in spec.lxc_guests:
        envs = [guest.env, *(v.env for v in guest.venvs)]
        if any(REDACTED in env.values() for env in envs):
            out.add(guest.name)
    return out
