"""Where two executions of one network part: the diagnostics behind `python -m pipeline compare` and
the export stage's failure line.

compare.py: two precisions of one graph, tensor by tensor (joined by name), and the aligned
comparison's result; trace.py: everything one onnxruntime run computes, in execution order;
align.py: two traces aligned; divergence.py: an ONNX model against its torch model, module by
module; exposed.py: running a model with every node result exposed (what all of them run);
render.py: their results as text, JSON and HTML (templates/).
"""
