"""The seeds of every sample input the stages make, in one place (so no two checks share samples by accident).

Calibration and the held-out accuracy samples (quant/calibration.py) are kept apart from these.
"""

from quant.calibration import CALIBRATION_SEED, HELD_OUT_SEED

OPTIMIZE_CHECK = 2000  # optimize: the optimized model against its input, one seed per checked size
FP16_SHAPE_CHECK = 5000  # fp16: the FP16 model runs at the profile's min/opt/max shapes
ENGINE_PROFILE = 3  # build: the per-layer profile run of each engine
BENCH = 4  # bench: the timed runs

__all__ = ["BENCH", "CALIBRATION_SEED", "ENGINE_PROFILE", "FP16_SHAPE_CHECK", "HELD_OUT_SEED", "OPTIMIZE_CHECK"]
