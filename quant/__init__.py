"""Precision stages: FP16 (ModelOpt AutoCast), INT8 Q/DQ (ModelOpt PTQ), calibration data, Q/DQ lint."""
