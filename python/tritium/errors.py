"""pb_utils error types (TritonError, TritonModelException) and the flag/enum constants pb_utils exposes."""

import enum

from .args import as_int, as_str

__all__ = [
    "TritonError",
    "TritonModelException",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_MEMORY_CPU",
]

# Flags, as in tritonserver.h (TRITONSERVER_RequestFlag,
# TRITONSERVER_ResponseCompleteFlag, TRITONSERVER_RequestReleaseFlag).
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class ErrorCode(enum.IntEnum):
    """TRITONSERVER_Error_Code values (Triton binds them as `TritonError.__ErrorCode`)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    # As pybind renders Triton's enum: `str(error.code())` is "__ErrorCode.INTERNAL".
    def __str__(self):
        return f"__ErrorCode.{self.name}"

    def __repr__(self):
        return f"<__ErrorCode.{self.name}: {self.value}>"

    def __format__(self, spec):
        return format(str(self), spec)


class MemoryType(enum.IntEnum):
    """PreferredMemory::MemoryType, exported by pb_utils as TRITONSERVER_MEMORY_*.

    Not TRITONSERVER_MemoryType: here GPU is 0 and CPU is 1.
    """

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class LogLevel(enum.IntEnum):
    """pb_utils.Logger.LogLevel (Logger also has the members: Logger.INFO ...); the native channel
    sends the number as the protocol's log level."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class MetricKind(enum.IntEnum):
    """Metric kinds, exposed by Triton as MetricFamily.COUNTER / GAUGE / HISTOGRAM."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class TritonModelException(Exception):
    """Raised by pb_utils operations that fail (Triton's PythonBackendException)."""


class TritonError:
    """An error carried by an InferenceResponse.

    As in Triton this is a plain object, not an exception: it is passed as
    `InferenceResponse(error=...)` and returned by `InferenceResponse.error()`.
    """

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    def __init__(self, message, code=ErrorCode.INTERNAL):
        # pybind11's std::string: a str or UTF-8 bytes; the code an ErrorCode or its number.
        self._message = as_str(message, "TritonError message")
        number = as_int(code, "TritonError code")
        try:
            self._code = ErrorCode(number)
        except ValueError:
            raise TypeError(
                f"TritonError code must be one of TritonError.UNKNOWN ... TritonError.CANCELLED (0-7), found {number}"
            ) from None

    def message(self):
        return self._message

    def code(self):
        return self._code

    def __str__(self):
        return self._message

    def __repr__(self):
        return f"TritonError({self._message!r}, TritonError.{self._code.name})"
