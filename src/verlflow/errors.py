"""The one exception type that reaches a user as a single line.

Every check on user input raises :class:`VerlflowError` with a message that names the bad
value and what would be valid. The CLI prints it as ``verlflow: error: <message>`` and exits
non-zero without a traceback; anything else is a bug and keeps its traceback.
"""


class VerlflowError(Exception):
    """A problem with the user's input or environment, explained in one line."""
