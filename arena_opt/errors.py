"""User-facing errors: the CLI prints them as one clear line and exits non-zero, no traceback."""


class InputError(Exception):
    """Bad input from a user: a file, field and value that can be named."""
