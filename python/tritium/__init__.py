"""tritium's Python side: the stub that runs Triton Python-backend models, and the pb_utils API."""
