"""Python's standard `logging` module in model code: records reach the server's log.

`install()` (called by the stub before it imports model.py) puts a `ServerHandler` on the root
logger and sets the root level to DEBUG. The handler sends each record through the same path as
`pb_utils.Logger` (`_runtime.log`), with the logger's name, `record.pathname` and `record.lineno`;
the server prints it inside the instance's span and applies its own log settings
(`--log-verbose`, `--log-info/--log-warning/--log-error`, and `/v2/logging` at run time), so a
DEBUG record appears only while the server's verbose level is on. The stub does not learn the
server's settings: records below them are sent and dropped by the server, which keeps run-time
changes exact.

`logging.basicConfig` in model code would be a no-op (the root logger already has a handler), so
`install()` wraps it:

- `level=` sets the root logger's level, as the model asked;
- `filename=` / `handlers=` add those handlers next to ours (the model's log file still fills);
- a stream handler (the default, or `stream=`) is not added: the record already reaches the server
  log with its level, and the server forwards the stub's stdout and stderr too, so a stream
  handler would print every record twice;
- `format=` / `datefmt=` / `style=` apply to the model's own file handlers only; the server log
  has its own format (time, level, span, file:line, logger name);
- `force=True` removes the model's handlers, never ours.
"""

import logging
import traceback

from . import _runtime
from .errors import LogLevel

_original_basic_config = logging.basicConfig


def server_level(levelno):
    """The server's level for a `logging` level number: DEBUG (and below) is verbose."""
    if levelno >= logging.ERROR:
        return LogLevel.ERROR
    if levelno >= logging.WARNING:
        return LogLevel.WARNING
    if levelno >= logging.INFO:
        return LogLevel.INFO
    return LogLevel.VERBOSE


def record_text(record):
    """`record.getMessage()` followed by the formatted exception and stack, as `logging.Formatter` adds them."""
    text = record.getMessage()
    if record.exc_info and record.exc_info[0] is not None:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
    elif record.exc_text:
        text += "\n" + record.exc_text
    if record.stack_info:
        text += "\n" + record.stack_info.rstrip("\n")
    return text


class ServerHandler(logging.Handler):
    """A `logging.Handler` that sends every record to the server's log (see the module docstring)."""

    def emit(self, record):
        try:
            text = record_text(record)
            _runtime.log(server_level(record.levelno), record.pathname, record.lineno, text, record.name)
        except Exception:  # noqa: BLE001 - never raise into model code (shutdown, closed channel)
            pass


def _basic_config(**kwargs):
    """`logging.basicConfig` for model code under tritium (see the module docstring)."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, ServerHandler)]
    if not ours:
        return _original_basic_config(**kwargs)
    level = kwargs.pop("level", None)
    force = kwargs.pop("force", False)
    kwargs.pop("stream", None)
    if force:
        for h in [h for h in root.handlers if not isinstance(h, ServerHandler)]:
            root.removeHandler(h)
            h.close()
    if level is not None:
        root.setLevel(level)
    if "filename" not in kwargs and "handlers" not in kwargs:
        return None
    if len(root.handlers) > len(ours):
        return None  # the model's handlers are already there: basicConfig's usual no-op
    for h in ours:
        root.removeHandler(h)
    try:
        _original_basic_config(**kwargs)
    finally:
        for h in ours:
            root.addHandler(h)
    return None


def install():
    """Sends the root logger's records to the server and makes `basicConfig` keep that; idempotent."""
    root = logging.getLogger()
    if not any(isinstance(h, ServerHandler) for h in root.handlers):
        root.addHandler(ServerHandler())
    root.setLevel(logging.DEBUG)
    logging.basicConfig = _basic_config
