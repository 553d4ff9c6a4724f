"""Run conformance scenarios against the real TensorRT bindings on sys.path; write their results as JSON.

    python -m conformance.runner RESULTS.json WORKDIR LAYER_INFO.json SCENARIO...

One process per TensorRT version: two versions' bindings cannot be imported into one process.
The bindings' module `tensorrt_bindings` is installed as `tensorrt`, the name the code and Polygraphy import.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    import tensorrt_bindings

    sys.modules["tensorrt"] = tensorrt_bindings
    from conformance.scenarios import run

    results, workdir, layer_information = Path(argv[0]), Path(argv[1]), Path(argv[2]).read_text()
    output = {name: run(name, tensorrt_bindings, workdir / name, layer_information) for name in argv[3:]}
    results.write_text(json.dumps(output))


if __name__ == "__main__":
    main(sys.argv[1:])
