"""User-facing errors: the CLI prints them as one clear line and exits non-zero, no traceback."""


class InputError(Exception):
    """Bad input from a user: a file, field and value that can be named."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: the command stops, keeps what it finished, writes nothing half-way and exits
    128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
