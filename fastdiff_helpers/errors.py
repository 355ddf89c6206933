"""FastdiffError: the package's one error for input and environment problems."""


class FastdiffError(ValueError):
    """An input or environment problem, with a message that says what to do next."""
