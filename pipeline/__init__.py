"""trt-pipeline: PyTorch/ONNX -> optimized ONNX -> FP16/INT8 -> TensorRT engines, with fusion reports."""

__version__ = "0.1.0"
