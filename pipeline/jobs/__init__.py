"""GPU benchmark jobs: a matrix spec (spec.py), its cells (plan.py), one cell's run (cell.py), the
local runner (runner.py), Kubernetes Indexed Jobs (k8s.py) and the gathered report (gather.py)."""
