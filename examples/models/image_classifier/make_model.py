"""Writes 1/model.onnx: a linear classifier of 8x8 grayscale images (64 FP32 pixels in [0, 1])
into 4 classes that say where the light is: left, right, top or bottom half. Its weights are
made here, not trained or downloaded: +1 on the class's half, -1 on the opposite half.

Run with the `onnx` package: python examples/models/image_classifier/make_model.py
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))


def weights():
    rows, cols = np.indices((8, 8))
    halves = [cols < 4, cols >= 4, rows < 4, rows >= 4]  # left, right, top, bottom
    w = np.stack([np.where(h, 1.0, -1.0).flatten() / 32 for h in halves], axis=1)
    return w.astype(np.float32)


def main():
    w = weights()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["PIXELS", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["LOGITS"])],
        "where_is_the_light",
        [helper.make_tensor_value_info("PIXELS", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["batch", 4])],
        initializer=[
            helper.make_tensor("W", TensorProto.FLOAT, list(w.shape), w.flatten().tolist()),
            helper.make_tensor("B", TensorProto.FLOAT, [4], [0.0] * 4),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tritium-example")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(HERE, "1", "model.onnx"))


if __name__ == "__main__":
    main()
