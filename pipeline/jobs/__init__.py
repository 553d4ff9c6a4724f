"""GPU benchmark jobs: a matrix spec (spec.py), its cells (plan.py), one cell's run (cell.py), the
local runner (runner.py), Kubernetes Indexed Jobs (k8s.py) and the gathered report (gather.py).

A cell builds and benchmarks one model x precision x shape x backend x builder setting x GPU type,
through the `build` command and trt/bench.py, and writes one JSON file (schema: CELL_SCHEMA).
"""
