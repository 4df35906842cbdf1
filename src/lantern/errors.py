"""One exception type for bad user input: the CLI prints its message as a single line and exits 2."""


class UserError(Exception):
    """Bad config, checkpoint, prompt or argument. The message says what is wrong and how to fix it."""
