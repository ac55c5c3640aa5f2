import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily(
            name="metered_requests_total",
            description="Requests seen by the metered model",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.last = pb_utils.MetricFamily(name="metered_last_x", description="Last X", kind=pb_utils.MetricFamily.GAUGE)
        self.sizes = pb_utils.MetricFamily(
            name="metered_x", description="X values", kind=pb_utils.MetricFamily.HISTOGRAM
        )
        labels = {"model": args["model_name"], "instance": args["model_instance_name"]}
        self.count = self.requests.Metric(labels=labels)
        self.gauge = self.last.Metric(labels=labels)
        self.hist = self.sizes.Metric(labels=labels, buckets=[1.0, 10.0])

    def execute(self, requests):
        out = []
        for r in requests:
            x = float(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
            self.count.increment(1)
            self.gauge.set(x)
            if x < 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative X")))
                continue
            self.hist.observe(x)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", np.array([self.count.value()]))]))
        return out
