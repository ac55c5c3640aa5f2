"""Shutdown finalizes every instance of every model before the server says it stopped.

The bug this catches: the versions to retire at shutdown were gathered in a map keyed by version
number, so of several models with a version 1 only one was finalized; the others' `finalize`
ran (or not) after the server had exited, and what they logged was lost.
"""

import numpy as np
import tritonclient.http as httpclient
from conftest import write_model

CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2, kind: KIND_CPU }} ]
"""

MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]

    def finalize(self):
        time.sleep(0.2)
        pb_utils.Logger.log_info(f"finalized {self.name}")
"""

NAMES = [f"finalized_{i}" for i in range(4)]


def test_every_instance_of_every_model_is_finalized_before_the_server_stops(start):
    for name in NAMES:
        write_model(start.repo, name, CONFIG.format(name=name), MODEL)
    srv = start(NAMES)
    client = httpclient.InferenceServerClient(srv.http_url)
    x = httpclient.InferInput("IN", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    for name in NAMES:
        client.infer(name, [x])
    assert srv.stop() == 0
    log = srv.log_text()
    stopped = log.rindex(" stopped\n")
    for name in NAMES:
        for i in range(2):
            line = f"finalized {name}_0_{i}"
            assert line in log, f"{line!r} not logged:\n{log}"
            assert log.index(line) < stopped, f"{line!r} logged after the server stopped:\n{log}"
