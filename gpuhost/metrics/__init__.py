"""Drift as Prometheus metrics: the audit's checks, versions and per-GPU telemetry of a host
(`gpuhost metrics`), in the text exposition format node_exporter's textfile collector serves."""
