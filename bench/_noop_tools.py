"""A do-nothing tool for the overhead benchmark."""


async def noop() -> int:
    """Return at once."""
    return 1


async def take(value: object = None) -> int:
    """Take the previous step's output (rendered from a template) and return at once."""
    return 1
