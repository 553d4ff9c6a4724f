"""The seeds of every sample input the project makes, in one place (so no two checks share samples by accident)."""

CALIBRATION_SEED = 10_000  # calibration data (quant/calibration.py): seed + i for the i-th sample
HELD_OUT_SEED = 20_000  # the held-out accuracy samples, apart from calibration's
COMPARE = 30_000  # compare's synthetic samples
OPTIMIZE_CHECK = 2000  # optimize: the optimized model against its input, one seed per checked size
FP16_SHAPE_CHECK = 5000  # the precision stages: a converted model runs at the profile's min/opt/max shapes
ENGINE_PROFILE = 3  # build: the per-layer profile run of each engine
BENCH = 4  # bench and the jobs cells: the timed runs
