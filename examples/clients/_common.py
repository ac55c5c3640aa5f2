"""Shared command-line handling for the example clients: --protocol http|grpc and --url."""

import argparse


def client_and_module(description):
    """Parses --protocol/--url and returns (args, client, tritonclient module)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--url", help="host:port (default 127.0.0.1:8000 for http, 127.0.0.1:8001 for grpc)")
    args = parser.parse_args()
    if args.protocol == "http":
        import tritonclient.http as module

        url = args.url or "127.0.0.1:8000"
    else:
        import tritonclient.grpc as module

        url = args.url or "127.0.0.1:8001"
    return args, module.InferenceServerClient(url=url), module
