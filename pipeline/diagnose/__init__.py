"""Where two executions of one network part: the diagnostics behind `python -m pipeline compare` and
the export stage's failure line (each module's docstring says which part it is; render.py writes the results)."""
