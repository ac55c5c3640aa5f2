"""Post-processing for image_pipeline: logits to the most likely label and its probability."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_dir = os.path.join(args["model_repository"])
        with open(os.path.join(model_dir, "labels.txt")) as f:
            self.labels = [line.strip() for line in f if line.strip()]

    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()
            exp = np.exp(logits - logits.max(axis=1, keepdims=True))
            probabilities = exp / exp.sum(axis=1, keepdims=True)
            best = probabilities.argmax(axis=1)
            labels = np.array([[self.labels[i].encode()] for i in best], dtype=object)
            scores = probabilities[np.arange(len(best)), best].reshape(-1, 1).astype(np.float32)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", labels), pb_utils.Tensor("SCORE", scores)])
            )
        return responses
