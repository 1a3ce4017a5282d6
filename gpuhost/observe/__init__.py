"""What a host shows: the observed-facts model the planner reads (plain data, no pyinfra)."""
