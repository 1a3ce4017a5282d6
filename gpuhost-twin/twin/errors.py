"""The error the twin's plumbing raises."""

from __future__ import annotations


class TwinError(RuntimeError):
    """A twin cannot be started, reached or stopped."""
