"""The error the ``linrnn`` command reports as one line: a bad argument or input, named with what was expected and
what was given. ``linrnn.cli.main`` prints ``linrnn <command>: <message>`` on stderr and exits 2 (a traceback only
with ``--debug``); library callers get it as a ``ValueError``."""

from pydantic import ValidationError


class UsageError(ValueError):
    """A bad argument or input: the message names it, the expected and the actual value."""


def one_line(error: BaseException) -> str:
    """``error``'s message on one line; a pydantic ``ValidationError`` as ``field: message; ...``."""
    if isinstance(error, ValidationError):
        parts = []
        for item in error.errors():
            message = item["msg"].removeprefix("Value error, ")
            parts.append(f"{'.'.join(map(str, item['loc']))}: {message}" if item["loc"] else message)
        text = "; ".join(parts)
    else:
        text = str(error)
    return " ".join(text.split())
