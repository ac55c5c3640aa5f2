"""Assembles tritium's wheel from a built tree: the `tritium` package with its abi3 native
module and `triton_python_backend_utils` (in site-packages, and again in share/tritium/python for
the stubs), and the `tritium` binary as a script (stdlib only).

Usage: python dist_wheel.py ROOT BINARY OUT_DIR VERSION
"""

import base64
import hashlib
import platform
import sys
import zipfile
from pathlib import Path


def main():
    root, binary, out, version = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    tag = f"py3-none-linux_{platform.machine()}"
    dist_info = f"tritium-{version}.dist-info"
    files = []
    package = root / "python" / "tritium"
    for path in sorted(package.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".tmp":
            continue
        files.append(("tritium/" + path.relative_to(package).as_posix(), path.read_bytes(), 0o644))
    utils = root / "python" / "triton_python_backend_utils.py"
    files.append((utils.name, utils.read_bytes(), 0o644))
    # Also under <env>/share/tritium/python, where the binary looks first: the stubs' PYTHONPATH
    # then holds tritium alone, not the whole site-packages (whose numpy would shadow a
    # per-model environment's own).
    files += [(f"tritium-{version}.data/data/share/tritium/python/{name}", data, mode) for name, data, mode in files]
    files.append((f"tritium-{version}.data/scripts/tritium", binary.read_bytes(), 0o755))
    files.append(
        (
            f"{dist_info}/METADATA",
            (
                "Metadata-Version: 2.1\nName: tritium\n"
                f"Version: {version}\n"
                "Summary: Serves NVIDIA Triton Python-backend model repositories (KServe v2 over HTTP and gRPC)\n"
                "Requires-Python: >=3.9\nRequires-Dist: numpy\n"
            ).encode(),
            0o644,
        )
    )
    files.append(
        (
            f"{dist_info}/WHEEL",
            f"Wheel-Version: 1.0\nGenerator: cargo xtask dist\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
            0o644,
        )
    )
    record = []
    for name, data, _ in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"tritium-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    print(wheel)


if __name__ == "__main__":
    main()
