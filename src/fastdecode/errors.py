"""One exception type for everything a user can get wrong.

The CLI turns it into a one-line message and exit code 2; library callers can
catch it as a ValueError.
"""


class FastDecodeError(ValueError):
    """Bad input: the message names what was wrong and what is accepted."""
