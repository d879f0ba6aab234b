"""A do-nothing tool for the overhead benchmark."""


async def noop() -> int:
    """Return at once."""
    return 1
