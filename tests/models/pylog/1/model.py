import logging
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

log = logging.getLogger("my.model")


def from_thread(marker):
    log.warning("thread:" + marker)


class TritonPythonModel:
    def initialize(self, args):
        log.info("pylog-init-info")

    def execute(self, requests):
        out = []
        for r in requests:
            marker = r.inputs()[0].as_numpy()[0].decode()
            if marker.startswith("basic-"):
                # What model code often does: a no-op for the stream, but its level applies.
                logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
            log.debug("debug:" + marker)
            log.info("info:" + marker)
            log.warning("warning:" + marker)
            log.error("error:" + marker)
            worker = threading.Thread(target=from_thread, args=(marker,))
            worker.start()
            worker.join()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([True]))]))
        return out
