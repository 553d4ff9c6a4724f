"""The real TensorRT files in tests/data/trt are byte-for-byte what TensorRT (or its tools) wrote."""

import hashlib

from conftest import TRT_DATA


def test_real_tensorrt_files_are_unchanged():
    listed = dict(reversed(line.split("  ", 1)) for line in (TRT_DATA / "SHA256SUMS").read_text().splitlines())
    present = {p.name for p in TRT_DATA.iterdir()} - {"SHA256SUMS"}
    assert present == set(listed), "every file in tests/data/trt has a checksum, and only those files are there"
    for name, digest in listed.items():
        assert hashlib.sha256((TRT_DATA / name).read_bytes()).hexdigest() == digest, f"{name} was modified"
