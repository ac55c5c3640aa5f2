"""Logs: pb_utils.Logger, Python's logging module and print() reach the server log at the right
level inside the instance's span, and the logging extension changes the settings at run time."""

import json
import os
import re
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def say(server, marker, model="chatty"):
    c = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("MARKER", [1], "BYTES")
    inp.set_data_from_numpy(np.array([marker.encode()], dtype=np.object_))
    c.infer(model, [inp])


def log_lines(server, needle, timeout=5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        lines = [line for line in server.log_text().splitlines() if needle in line]
        if lines:
            return lines
        time.sleep(0.05)
    return []


def test_logger_lines_have_level_file_line_and_instance(server):
    info = log_lines(server, "chatty-init-info")
    assert info, server.log_text()[-2000:]
    line = info[0]
    assert " INFO " in line and re.search(r"chatty/1/model\.py:9\]", line), line
    assert "model=chatty" in line and "instance=chatty_0" in line and "pid=" in line, line
    assert " WARN " in log_lines(server, "chatty-init-warning")[0]
    assert " ERROR " in log_lines(server, "chatty-init-error")[0]
    assert not log_lines(server, "chatty-init-verbose", timeout=0.2), "verbose lines need --log-verbose"


def test_print_and_stderr_are_forwarded_line_by_line(server):
    say(server, "m1")
    assert log_lines(server, "print:m1")
    assert log_lines(server, "stderr:m1")
    assert log_lines(server, "logger:m1")


def test_huge_lines_and_invalid_utf8_do_not_end_the_output_reader(server):
    say(server, "huge:m4")
    bad = log_lines(server, "bad-bytes:", timeout=20)
    assert bad and "\ufffd\ufffd:huge:m4" in bad[0], bad
    pieces = [line for line in server.log_text().splitlines() if "ZZZZZZZZ" in line]
    assert len(pieces) >= (20 << 20) // (16 << 10), "the 20 MB line is split into bounded pieces"
    assert max(len(p) for p in pieces) < (16 << 10) + 500
    # The model's later prints still reach the log: its stdout pipe was never closed.
    say(server, "m5")
    assert log_lines(server, "print:m5")


def test_logging_extension_over_http_and_grpc(server):
    h = httpclient.InferenceServerClient(server.http_url)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    settings = h.get_log_settings()
    assert settings == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    try:
        assert h.update_log_settings({"log_info": False})["log_info"] is False
        say(server, "hidden-m2")
        assert log_lines(server, "logger:hidden-m2", timeout=0.5) == []
        got = g.update_log_settings({"log_info": True, "log_verbose_level": 1}, as_json=True)
        assert got["settings"]["log_verbose_level"]["uint32_param"] == 1
        say(server, "shown-m3")
        assert log_lines(server, "logger:shown-m3")
    finally:
        h.update_log_settings({"log_info": True, "log_verbose_level": 0})
    bad = None
    try:
        h.update_log_settings({"log_format": "xml"})
    except Exception as e:  # noqa: BLE001
        bad = str(e)
    assert bad and "invalid log format 'xml'" in bad


def test_no_client_can_choose_the_log_file(server, tmp_path):
    """CVE-2024-0087 in Triton: a client that names `log_file` could make the server append its
    log (with text the client controls) to any file. Refused on both protocols with Triton's text,
    nothing is written, and the other settings of the same request are not applied either."""
    h = httpclient.InferenceServerClient(server.http_url)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    target = tmp_path / "bashrc"
    for update in (
        lambda: h.update_log_settings({"log_file": str(target), "log_info": False}),
        lambda: g.update_log_settings({"log_file": str(target), "log_info": False}),
        lambda: h.update_log_settings({"log_file": ""}),
    ):
        with pytest.raises(
            InferenceServerException, match="log file location can not be updated through network protocol"
        ):
            update()
    # A request naming an unknown model puts client text into the log; it must not reach the file.
    with pytest.raises(InferenceServerException):
        h.get_model_metadata("x;touch pwned;")
    assert not target.exists()
    assert h.get_log_settings()["log_file"] == "" and h.get_log_settings()["log_info"] is True
    assert h.is_server_live()
    raw = urllib.request.Request(
        f"http://{server.http_url}/v2/logging", data=json.dumps({"log_file": str(target)}).encode(), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(raw, timeout=10)
    assert refused.value.code == 501
    assert "log file location" in json.loads(refused.value.read())["error"]


def test_log_format_and_switches_take_effect_at_once_and_back(server):
    """Each log statement's enabled/disabled answer is cached per call site: a settings change
    must reach the call sites that already ran (the server's own lines and the model's)."""
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        h.update_log_settings({"log_format": "json"})
        say(server, "json-m6")
        lines = log_lines(server, "logger:json-m6")
        assert lines and lines[0].lstrip().startswith("{"), lines
        assert json.loads(lines[0])["fields"]["message"].endswith("logger:json-m6"), lines[0]
        h.update_log_settings({"log_format": "default", "log_warning": False})
        say(server, "plain-m7")
        lines = log_lines(server, "logger:plain-m7")
        assert lines and not lines[0].lstrip().startswith("{"), lines
        assert " INFO " in lines[0], lines
    finally:
        h.update_log_settings({"log_format": "default", "log_warning": True})


PYLOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "pylog", "1", "model.py")


def pylog_line(call):
    """The line of `pylog/1/model.py` that makes `call` (`log.info("info:"`...)."""
    with open(PYLOG) as f:
        return next(n for n, text in enumerate(f, 1) if call in text)


def python_logging_lines(server, marker, verbose):
    """Checks the records of one `pylog` request: each once, at its level, with logger, file and line."""
    expected = [
        ("info", " INFO ", 'log.info("info:"'),
        ("warning", " WARN ", 'log.warning("warning:"'),
        ("error", " ERROR ", 'log.error("error:"'),
        ("thread", " WARN ", 'log.warning("thread:"'),
    ]
    if verbose:
        expected.append(("debug", " DEBUG ", 'log.debug("debug:"'))
    say(server, marker, "pylog")
    for what, level, call in expected:
        lines = log_lines(server, f"{what}:{marker}")
        assert lines, (what, server.log_text()[-3000:])
        time.sleep(0.2)  # a duplicate (the model's stream handler, forwarded stderr) would follow quickly
        lines = log_lines(server, f"{what}:{marker}")
        assert len(lines) == 1, lines
        line = lines[0]
        assert level in line, line
        assert re.search(rf"pylog/1/model\.py:{pylog_line(call)}\] my\.model: {what}:{marker}$", line), line
        assert "model=pylog" in line and "instance=pylog_0" in line, line
    if not verbose:
        assert not log_lines(server, f"debug:{marker}", timeout=0.3), "debug records need --log-verbose"


def test_python_logging_reaches_the_server_log_with_and_without_basic_config(server):
    h = httpclient.InferenceServerClient(server.http_url)
    assert log_lines(server, "my.model: pylog-init-info")
    try:
        python_logging_lines(server, "plain-1", verbose=False)
        h.update_log_settings({"log_verbose_level": 1})
        python_logging_lines(server, "plain-2", verbose=True)
        h.update_log_settings({"log_warning": False})
        say(server, "plain-3", "pylog")
        assert log_lines(server, "error:plain-3")
        assert not log_lines(server, "warning:plain-3", timeout=0.3), "--log-warning false hides warnings"
        h.update_log_settings({"log_warning": True, "log_verbose_level": 0})
        # basicConfig(level=INFO, format=...): the model's level applies, no stream handler is added.
        python_logging_lines(server, "basic-4", verbose=False)
        h.update_log_settings({"log_verbose_level": 1})
        say(server, "basic-5", "pylog")
        assert log_lines(server, "error:basic-5")
        assert not log_lines(server, "debug:basic-5", timeout=0.3), "the model's basicConfig level is INFO"
    finally:
        h.update_log_settings({"log_info": True, "log_warning": True, "log_verbose_level": 0})


IMPORT_TIME_MODEL = """
import logging

import numpy as np
import triton_python_backend_utils as pb_utils

# What many model files do at import time, before tritium has called initialize.
logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(levelname)s %(message)s")


class TritonPythonModel:
    def execute(self, requests):
        marker = requests[0].inputs()[0].as_numpy()[0].decode()
        logging.debug("root-debug:" + marker)
        logging.info("root-info:" + marker)
        logging.getLogger("imp.model").warning("named-warning:" + marker)
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("imp.model").exception("caught:" + marker)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([True]))]) for _ in requests]
"""


def test_import_time_basic_config_and_the_servers_start_flags(start):
    """`logging.basicConfig(level=DEBUG)` at import time: the root logger's records (logger name
    `root`) and named loggers' reach the server log once each, with file and line, a logged
    exception carries its traceback, and the server's own flags (`--log-verbose 1`,
    `--log-info false`) decide what is shown."""
    model_dir = os.path.join(start.repo, "imp", "1")
    os.makedirs(model_dir)
    with open(os.path.join(start.repo, "imp", "config.pbtxt"), "w") as f:
        f.write(
            'name: "imp"\nbackend: "python"\n'
            'input [ { name: "MARKER" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
            'output [ { name: "OK" data_type: TYPE_BOOL dims: [ 1 ] } ]\n'
        )
    with open(os.path.join(model_dir, "model.py"), "w") as f:
        f.write(IMPORT_TIME_MODEL)
    srv = start(["imp"], ["--log-verbose", "1", "--log-info", "false"])
    say(srv, "m1", "imp")

    def line_of(call):
        return next(n for n, text in enumerate(IMPORT_TIME_MODEL.splitlines(), 1) if call in text)

    for needle, level, call, logger in [
        ("root-debug:m1", " DEBUG ", "logging.debug(", "root"),
        ("named-warning:m1", " WARN ", ".warning(", "imp.model"),
        ("caught:m1", " ERROR ", ".exception(", "imp.model"),
    ]:
        assert log_lines(srv, needle), (needle, srv.log_text()[-3000:])
        time.sleep(0.2)
        lines = log_lines(srv, needle)
        assert len(lines) == 1, lines
        assert level in lines[0], lines[0]
        assert re.search(rf"imp/1/model\.py:{line_of(call)}\] {re.escape(logger)}: {needle}", lines[0]), lines[0]
    assert log_lines(srv, "ValueError: boom"), "the traceback follows the exception's record"
    assert not log_lines(srv, "root-info:m1", timeout=0.3), "--log-info false hides INFO records"
