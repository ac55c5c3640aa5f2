"""Process-wide state of a running stub that pb_utils objects need: the channel, cancellations, logging."""

import sys

channel = None
cancelled = set()
# Whether the model is decoupled (model_transaction_policy.decoupled), set at initialize.
decoupled = False
# The model's version directory (`pb_utils.get_model_dir()`), set at auto-complete and initialize.
model_dir = None


def log(level, file, line, message, logger=""):
    """Sends a log record (`level` is an `errors.LogLevel`, `logger` a `logging` logger's name or empty) to
    the server, or writes it to stderr outside a stub."""
    if channel is not None:
        channel.send_log(int(level), file, line, message, logger)
    else:
        name = f"{logger}: " if logger else ""
        sys.stderr.write(f"{level.name[0]} {file}:{line}] {name}{message}\n")
