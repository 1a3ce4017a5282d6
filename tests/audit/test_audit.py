"""`pytest tests/audit --inventory FILE [--hosts=ssh://root@HOST]`: the audit, run from a checkout.

The suite itself ships with gpuhost (gpuhost/audit/suite), so `gpuhost audit` runs the same tests.
"""

from gpuhost.audit.suite.test_audit import test_audit

__all__ = ["test_audit"]
