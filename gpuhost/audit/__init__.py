"""The audit: does a host (and its GPU guests) match the Plan its inventory gives?

One batched command reads the host (the deploy's facts plus what only the audit needs), one
more per GPU container reads the guest through ``pct exec``; the checks then compare the Plan,
made from the same spec and facts the deploy uses, with what was seen. Pure from there on:
``checks`` functions take observations and return findings, and the pytest suite
(``gpuhost.audit.suite``, run by ``pytest tests/audit`` or ``gpuhost audit``) reports them.
"""
