"""One exception type for everything a user can get wrong.

The CLI turns it into a one-line message and exit code 2; library callers can
catch it as a ValueError.
"""


class FastDecodeError(ValueError):
    """Bad input: the message names what was wrong and what is accepted."""


class ConstraintFailed(FastDecodeError):
    """A request's output constraint failed while it generated (e.g. a regex whose lazily built
    lexer runs past llguidance's limits): the request's own input, so a server answers 400."""
