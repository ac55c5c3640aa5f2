"""Model warmup and instance kinds end to end.

The warmup model appends one line per request it executes to a file in its directory (instance
name, the input's shape and values), so a test sees which warmup requests ran, and that they ran
before the model was ready.
"""

import json
import os
import struct
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import cuda_device_count
from test_faults import write_model

RECORDING = """
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "seen.log")
        self.instance = args["model_instance_name"]
        self.kind = args["model_instance_kind"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            with open(self.log, "a") as f:
                f.write(json.dumps({"instance": self.instance, "kind": self.kind, "shape": list(x.shape),
                                    "values": x.flatten().tolist()}) + "\\n")
            if x.size and x.flatten()[0] == 13:
                raise pb_utils.TritonModelException("unlucky warmup value 13")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.astype(np.float32))]))
        return responses
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ {group} }} ]
{extra}
"""


def seen(repo, name):
    path = os.path.join(repo, name, "seen.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def index(srv, settled=()):
    """The repository index by name, once the models in `settled` are no longer loading."""
    deadline = time.time() + 60
    while True:
        req = urllib.request.Request(f"http://{srv.http_url}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            entries = {m["name"]: m for m in json.loads(r.read())}
        loading = [n for n in settled if entries.get(n, {}).get("state") in (None, "LOADING")]
        if not loading or time.time() > deadline:
            return entries
        time.sleep(0.05)


WARMUP = """
model_warmup [
  {
    name: "zeros"
    batch_size: 2
    count: 3
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }
  },
  {
    name: "from_file"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "input0.bin" } }
  },
  {
    name: "random"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] random_data: true } }
  }
]
"""


def test_warmup_runs_on_every_instance_before_ready_and_is_not_in_statistics(start):
    write_model(
        start.repo, "warm", RECORDING, CONFIG.format(name="warm", mbs=4, group="kind: KIND_CPU count: 2", extra=WARMUP)
    )
    os.makedirs(os.path.join(start.repo, "warm", "warmup"))
    with open(os.path.join(start.repo, "warm", "warmup", "input0.bin"), "wb") as f:
        f.write(struct.pack("<2f", 1.5, -2.5))
    srv = start(["warm"])
    # Ready means warmed up: every instance ran every sample already.
    lines = seen(srv.repository, "warm")
    for instance in ("warm_0_0", "warm_0_1"):
        mine = [line for line in lines if line["instance"] == instance]
        # zeros: 2 requests x 3 iterations; from_file: 1; random: 1.
        assert len(mine) == 8, mine
        assert all(line["shape"] == [1, 2] for line in mine), "batching models get batch dimension 1"
        assert sum(line["values"] == [0.0, 0.0] for line in mine) >= 6
        assert [1.5, -2.5] in [line["values"] for line in mine]
    for module, client in (
        (httpclient, httpclient.InferenceServerClient(srv.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(srv.grpc_url)),
    ):
        stats = client.get_inference_statistics("warm", as_json=True) if module is grpcclient else None
        stats = stats or client.get_inference_statistics("warm")
        s = stats["model_stats"][0]
        assert int(s.get("inference_count", 0)) == 0, "warmup requests are not inferences"
        assert int(s.get("execution_count", 0)) == 0
    # The model serves normally afterwards.
    client = httpclient.InferenceServerClient(srv.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.array([[3.0, 4.0]], dtype=np.float32))
    out = client.infer("warm", [inp]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, [[3.0, 4.0]])


def test_a_failing_warmup_fails_the_load_with_its_reason_in_the_index(start):
    failing = """
    model_warmup [ {
      name: "unlucky"
      batch_size: 1
      inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "thirteen.bin" } }
    } ]
    """
    write_model(start.repo, "cold", RECORDING, CONFIG.format(name="cold", mbs=0, group="kind: KIND_CPU", extra=failing))
    os.makedirs(os.path.join(start.repo, "cold", "warmup"))
    with open(os.path.join(start.repo, "cold", "warmup", "thirteen.bin"), "wb") as f:
        f.write(struct.pack("<2f", 13.0, 0.0))
    missing = failing.replace("thirteen.bin", "absent.bin")
    write_model(
        start.repo, "nofile", RECORDING, CONFIG.format(name="nofile", mbs=0, group="kind: KIND_CPU", extra=missing)
    )
    # A sample without the model's input: refused before the model sees it, with Triton's text.
    unnamed = failing.replace('key: "INPUT0"', 'key: "NOPE"').replace(
        'input_data_file: "thirteen.bin"', "zero_data: true"
    )
    write_model(
        start.repo, "unnamed", RECORDING, CONFIG.format(name="unnamed", mbs=0, group="kind: KIND_CPU", extra=unnamed)
    )
    write_model(start.repo, "fine", RECORDING, CONFIG.format(name="fine", mbs=0, group="kind: KIND_CPU", extra=""))
    srv = start(["fine"])
    entries = index(srv, settled=["cold", "nofile", "unnamed"])
    cold = entries["cold"]
    assert cold["state"] == "UNAVAILABLE"
    assert "failed to run warmup sample 'unlucky': " in cold["reason"]
    assert "unlucky warmup value 13" in cold["reason"]
    assert seen(srv.repository, "cold")[0]["shape"] == [2], "a non-batching model gets the dims as they are"
    assert entries["nofile"]["state"] == "UNAVAILABLE"
    assert "failed to open text file for read" in entries["nofile"]["reason"]
    assert "absent.bin" in entries["nofile"]["reason"]
    assert entries["unnamed"]["reason"].startswith(
        "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'unnamed'. Got input(s) [], but "
        "missing required input(s) ['INPUT0']."
    ), entries["unnamed"]
    assert seen(srv.repository, "unnamed") == [], "the model never ran the sample"


def test_kind_model_and_kind_cpu_with_host_policy_load_and_kind_gpu_is_refused(start):
    write_model(
        start.repo, "kmodel", RECORDING, CONFIG.format(name="kmodel", mbs=0, group="kind: KIND_MODEL", extra="")
    )
    write_model(
        start.repo,
        "kcpu",
        RECORDING,
        CONFIG.format(name="kcpu", mbs=0, group='kind: KIND_CPU count: 2 host_policy: "policy0"', extra=""),
    )
    write_model(
        start.repo, "kgpu", RECORDING, CONFIG.format(name="kgpu", mbs=0, group="kind: KIND_GPU gpus: [ 0 ]", extra="")
    )
    write_model(
        start.repo, "kgpu_any", RECORDING, CONFIG.format(name="kgpu_any", mbs=0, group="kind: KIND_GPU", extra="")
    )
    srv = start(["kmodel", "kcpu"])
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    for name in ("kmodel", "kcpu"):
        inp = grpcclient.InferInput("INPUT0", [2], "FP32")
        inp.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
        client.infer(name, [inp])
    assert seen(srv.repository, "kmodel")[0]["kind"] == "MODEL"
    assert seen(srv.repository, "kcpu")[0]["kind"] == "CPU"
    config = client.get_model_config("kcpu", as_json=True)["config"]
    assert config["instance_group"][0]["host_policy"] == "policy0"
    assert int(config["instance_group"][0]["count"]) == 2
    if cuda_device_count():
        return  # tests/test_cuda_shm.py checks KIND_GPU placement on a machine with GPUs
    # On a machine without GPUs, KIND_GPU is refused with Triton's texts.
    entries = index(srv, settled=["kgpu", "kgpu_any"])
    assert entries["kgpu"]["state"] == "UNAVAILABLE"
    assert "specifies invalid or unsupported gpu id 0. Available GPUs are: " in entries["kgpu"]["reason"]
    assert entries["kgpu_any"]["state"] == "UNAVAILABLE"
    assert "has kind KIND_GPU but no GPUs are available" in entries["kgpu_any"]["reason"]


DECOUPLED = """
import json, os, threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "seen.log")

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            with open(self.log, "a") as f:
                f.write(json.dumps({"shape": list(x.shape), "values": x.flatten().tolist()}) + "\\n")
            sender = request.get_response_sender()

            def answer(sender=sender, x=x):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.astype(np.float32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            # The final response comes after execute returned: warmup waits for it.
            threading.Timer(0.05, answer).start()
        return None
"""


def test_a_decoupled_model_is_warmed_up_until_its_final_responses(start):
    warmup = """
    model_transaction_policy { decoupled: true }
    model_warmup [ {
      name: "streamed"
      batch_size: 1
      count: 2
      inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }
    } ]
    """
    write_model(
        start.repo, "dwarm", DECOUPLED, CONFIG.format(name="dwarm", mbs=0, group="kind: KIND_CPU", extra=warmup)
    )
    srv = start(["dwarm"])
    assert len(seen(srv.repository, "dwarm")) == 2
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    stats = client.get_inference_statistics("dwarm", as_json=True)["model_stats"][0]
    assert int(stats.get("inference_count", 0)) == 0
    assert "broke the protocol" not in srv.log_text(), "no warmup response arrives after its request ended"
    assert [i for i in client.get_model_repository_index(as_json=True)["models"] if i["name"] == "dwarm"][0][
        "state"
    ] == "READY"
