from twin.pytest_plugin import twin, twin_fleet, twins  # noqa: F401  (fixtures)
