"""The shared base the stages stand on: errors, atomic file I/O, the manifest, profiles, sample
inputs, the ONNX graph index, onnxruntime runs, device checks. It imports nothing of `pipeline`, `quant` or `trt`
outside itself; `quant/` and `trt/` import from it, and the rest of `pipeline/` (CLI, runner,
stages, export, optimize, models) sits on top (tests/test_layers.py)."""

DEFAULT_PROFILE = "bert-tiny"
