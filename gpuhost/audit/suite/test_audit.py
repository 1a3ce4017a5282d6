"""The audit suite: one test per check and target (host, or host/guest). See gpuhost.audit.plugin."""

import pytest

from gpuhost.audit.plugin import AuditCase, verify

pytestmark = pytest.mark.audit


def test_audit(audit_case: AuditCase) -> None:
    verify(audit_case)
