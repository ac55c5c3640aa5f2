"""Tests for `tritium.pylogging`: Python `logging` records go to the server's log through a fake channel."""

import logging
import sys
import threading

import pytest
from tritium import _runtime, pylogging
from tritium.errors import LogLevel


class FakeChannel:
    """Records `send_log` calls as the native channel would receive them."""

    def __init__(self):
        self.logs = []

    def send_log(self, level, file, line, message, logger=""):
        self.logs.append((LogLevel(level), file, line, message, logger))

    def of(self, logger):
        """The records of `logger`: the root logger is at DEBUG in these tests, so a library's
        debug record from a background thread (an HTTP client of an earlier test in the same
        worker closing its connection) may arrive meanwhile."""
        return [r for r in self.logs if r[4] == logger]


@pytest.fixture
def channel(monkeypatch):
    fake = FakeChannel()
    monkeypatch.setattr(_runtime, "channel", fake)
    return fake


@pytest.fixture
def installed(monkeypatch):
    """Installs the handler as the stub does, then restores the root logger and `basicConfig`."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    monkeypatch.setattr(logging, "basicConfig", logging.basicConfig)
    root.handlers[:] = []  # as in a fresh stub process (pytest adds capture handlers)
    pylogging.install()
    yield root
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


def this_line():
    return sys._getframe(1).f_lineno


@pytest.mark.parametrize(
    "levelno,expected",
    [
        (logging.DEBUG, LogLevel.VERBOSE),
        (5, LogLevel.VERBOSE),
        (logging.INFO, LogLevel.INFO),
        (logging.WARNING, LogLevel.WARNING),
        (logging.ERROR, LogLevel.ERROR),
        (logging.CRITICAL, LogLevel.ERROR),
        (25, LogLevel.INFO),
    ],
)
def test_levels_map_to_the_servers(levelno, expected):
    assert pylogging.server_level(levelno) is expected


def test_records_carry_level_logger_file_and_line(channel, installed):
    log = logging.getLogger("my.model")
    line = this_line() + 1
    log.debug("d %s", 1)
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")
    assert channel.of("my.model") == [
        (LogLevel.VERBOSE, __file__, line, "d 1", "my.model"),
        (LogLevel.INFO, __file__, line + 1, "i", "my.model"),
        (LogLevel.WARNING, __file__, line + 2, "w", "my.model"),
        (LogLevel.ERROR, __file__, line + 3, "e", "my.model"),
        (LogLevel.ERROR, __file__, line + 4, "c", "my.model"),
    ]


def test_exception_and_stack_are_appended(channel, installed):
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("x").exception("failed")
    logging.getLogger("x").info("here", stack_info=True)
    (level, _, _, text, _), (_, _, _, stacked, _) = channel.of("x")
    assert level is LogLevel.ERROR
    assert text.startswith("failed\nTraceback (most recent call last):") and text.endswith("ValueError: boom")
    assert stacked.startswith("here\nStack (most recent call last):")


def test_basic_config_keeps_our_handler_applies_level_and_adds_no_stream(channel, installed, capsys):
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    assert installed.level == logging.WARNING
    assert [type(h) for h in installed.handlers].count(pylogging.ServerHandler) == 1
    assert not any(type(h) is logging.StreamHandler for h in installed.handlers)
    logging.getLogger("m").info("hidden")
    logging.getLogger("m").warning("shown")
    assert [r[3] for r in channel.logs] == ["shown"]
    assert capsys.readouterr().err == ""


def test_basic_config_with_a_file_adds_it_next_to_ours(channel, installed, tmp_path):
    path = tmp_path / "model.log"
    installed.handlers[:] = [h for h in installed.handlers if isinstance(h, pylogging.ServerHandler)]  # pytest's
    logging.basicConfig(filename=str(path), format="F %(message)s")
    logging.getLogger("m").warning("both")
    for h in installed.handlers:
        h.flush()
    assert path.read_text() == "F both\n"
    assert [r[3] for r in channel.logs] == ["both"]
    logging.basicConfig(force=True)
    assert [type(h) for h in installed.handlers] == [pylogging.ServerHandler]


def test_records_from_threads_arrive(channel, installed):
    threads = [threading.Thread(target=logging.getLogger("t").info, args=(f"n{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Logger "t"'s only: another test's client in this process may log as it closes meanwhile.
    assert sorted(r[3] for r in channel.logs if r[4] == "t") == [f"n{i}" for i in range(8)]


def test_a_gone_or_broken_channel_never_raises(installed, monkeypatch, capsys):
    class Closed:
        def send_log(self, *args):
            raise RuntimeError("channel closed")

    monkeypatch.setattr(_runtime, "channel", Closed())
    logging.getLogger("m").error("lost")
    monkeypatch.setattr(_runtime, "channel", None)
    logging.getLogger("m").warning("after")
    assert "W " in capsys.readouterr().err
    monkeypatch.setattr(sys, "stderr", None)  # interpreter shutdown
    logging.getLogger("m").warning("at exit")
