# GPU jobs: build, inspect, profile and benchmark TensorRT engines.
# Base: NVIDIA's TensorRT NGC image, release 25.01, which carries TensorRT 10.8.0.43 with CUDA 12.8
# and Python 3.12 (NGC container release notes / framework support matrix). For TensorRT 11.x pass
# a newer TensorRT image: docker build --build-arg BASE=nvcr.io/nvidia/tensorrt:<tag> .
ARG BASE=nvcr.io/nvidia/tensorrt:25.01-py3
FROM ${BASE}

WORKDIR /work
COPY pyproject.toml README.md ./
COPY docker docker
COPY pipeline pipeline
COPY trt trt
COPY quant quant
COPY profiles profiles
COPY tests tests
COPY bench bench
# One resolution of docker/requirements.txt (torch: the CUDA 12.8 build from PyTorch's index) and the
# project; TensorRT is the image's (tests/test_docker_image.py checks the same resolution).
RUN python -m pip install --no-cache-dir -r docker/requirements.txt -e ".[dev]"

ENTRYPOINT ["python", "-m", "pipeline"]
CMD ["--help"]
