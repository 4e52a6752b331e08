"""The one exception type a user sees.

Every problem caused by the user's input (a missing folder, a corrupt file, a bad
flag) is raised as a `TurboGSError` whose message names *what* is wrong and *where*.
The CLI prints that message as one line and exits with code 2; anything else is a
bug and keeps its traceback.
"""


class TurboGSError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    exit_code = 2


class InputError(TurboGSError):
    """An input file or folder is missing, malformed or inconsistent."""
