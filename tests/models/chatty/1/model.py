import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("chatty-init-info")
        pb_utils.Logger.log_warn("chatty-init-warning")
        pb_utils.Logger.log_error("chatty-init-error")
        pb_utils.Logger.log_verbose("chatty-init-verbose")

    def execute(self, requests):
        out = []
        for r in requests:
            marker = r.inputs()[0].as_numpy()[0].decode()
            if marker.startswith("huge:"):
                # A 20 MB line, then bytes that are not UTF-8: neither may end the server's reader.
                sys.stdout.write("Z" * (20 << 20) + "\n")
                sys.stdout.flush()
                sys.stdout.buffer.write(b"bad-bytes:\xff\xfe:" + marker.encode() + b"\n")
                sys.stdout.buffer.flush()
            print("print:" + marker)
            print("stderr:" + marker, file=sys.stderr)
            pb_utils.Logger.log_info("logger:" + marker)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([True]))]))
        return out
