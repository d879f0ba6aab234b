"""The budget rules: how a chain's time is split across its steps and inside its groups, and
its token budget (pure decisions, no clock, no I/O; the runner drives them)."""
