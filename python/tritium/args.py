"""Arguments of the pb_utils API taken the way Triton's pybind11 bindings take them.

Triton's `triton_python_backend_utils` is C++ behind pybind11, so what a parameter accepts is what
pybind11's type casters accept, and model code relies on it:

- a `std::string` takes `str` and also `bytes` (and `bytearray`), read as UTF-8: a model that
  reads a model name from a BYTES input tensor passes `bytes`;
- an integer takes `int` and anything with `__index__` (numpy integer scalars), never a `float`;
- a `double` takes `float`, `int` and anything with `__float__` or `__index__` (numpy scalars);
- a `std::vector<T>` takes any sequence of `T` (a list, a tuple, a numpy array) except a `str`
  or `bytes`, which would be read as a sequence of characters. tritium also takes a set or
  another iterable, as it always has.

Every pb_utils entry point normalises its arguments here, so the rules live in one place; a
value of the wrong type raises `TypeError` naming the argument, the type it needs and the type it
got.
"""

import operator

__all__ = ["as_str", "as_int", "as_double", "as_bool", "as_str_list", "as_list", "as_str_opt", "as_double_opt"]


def _type_name(value):
    return type(value).__qualname__


def as_str_opt(value):
    """`value` as a `str` if pybind11's `std::string` caster takes it (str, UTF-8 bytes or
    bytearray), else None."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def as_str(value: object, what: str) -> str:
    """`value` as a `str` (see `as_str_opt`); `what` names the argument in the TypeError."""
    text = as_str_opt(value)
    if text is None:
        if isinstance(value, (bytes, bytearray)):
            raise TypeError(f"{what} must be a str or UTF-8 bytes; the bytes given are not valid UTF-8: {value!r}")
        raise TypeError(f"{what} must be a str (or UTF-8 bytes), found type '{_type_name(value)}'")
    return text


def as_int(value, what, lo=None, hi=None):
    """`value` as an `int` the way pybind11's integer casters take it (int, bool, numpy integer
    scalars: anything with `__index__`; never a float), checked against `lo` and `hi` when given."""
    if isinstance(value, float):
        raise TypeError(f"{what} must be an int, found type '{_type_name(value)}' ({value!r})")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, found type '{_type_name(value)}'") from None
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        raise TypeError(f"{what} must be an int in [{lo}, {hi}], found {number}")
    return int(number)


def as_double_opt(value):
    """`value` as a `float` if pybind11's `double` caster takes it (float, int, numpy scalars:
    anything with `__float__` or `__index__`, but not str or bytes), else None."""
    if isinstance(value, float):
        return float(value)
    if value is None or isinstance(value, (str, bytes, bytearray)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def as_double(value, what):
    """`value` as a `float` (see `as_double_opt`)."""
    number = as_double_opt(value)
    if number is None:
        raise TypeError(f"{what} must be a number, found type '{_type_name(value)}'")
    return number


def as_bool(value, what):
    """`value` as a `bool` the way pybind11's `bool` caster takes it (bool, numpy.bool_, or an
    object with `__bool__`, but not None, a str or bytes)."""
    if isinstance(value, bool):
        return value
    if value is None or isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"{what} must be a bool, found type '{_type_name(value)}'")
    try:
        return bool(value)
    except Exception:  # noqa: BLE001 - a numpy array of several elements, say
        raise TypeError(f"{what} must be a bool, found type '{_type_name(value)}'") from None


def as_list(value, what):
    """`value`, any sequence or iterable but a str or bytes, as a list (None: an empty list)."""
    if value is None:
        return []
    if isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"{what} must be a list (or another sequence), found type '{_type_name(value)}'")
    if isinstance(value, dict):
        raise TypeError(f"{what} must be a list (or another sequence), found type 'dict'")
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{what} must be a list (or another sequence), found type '{_type_name(value)}'") from None


def as_str_list(value, what):
    """`value` as a list of `str` (a sequence of str or UTF-8 bytes: a list, a tuple, a set, a
    numpy array of strings or of bytes objects)."""
    items = as_list(value, what)
    out = []
    for i, item in enumerate(items):
        text = as_str_opt(item)
        if text is None:
            raise TypeError(
                f"{what} must be a list of str (or UTF-8 bytes), found type '{_type_name(item)}' at index {i}"
            )
        out.append(text)
    return out
