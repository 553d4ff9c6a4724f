"""The shared base the stages stand on (errors, file I/O, the manifest, profiles, samples, the graph index, onnxruntime runs).
It imports nothing of `pipeline`, `quant` or `trt` outside itself; they import from it (tests/test_layers.py)."""

DEFAULT_PROFILE = "bert-tiny"
