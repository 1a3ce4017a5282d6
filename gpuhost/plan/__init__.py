"""The planner: spec + observed facts -> the Plan (pure: no I/O, no pyinfra)."""
