"""The bench stage: every engine the build wrote, timed with CUDA events (trt/bench.py), JSON and a plot.
It measures this machine: never cached."""

from __future__ import annotations

from pipeline.core import seeds
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages.engines import engines_built, no_engine, skip_without_tensorrt


def run_bench(job: Job) -> StageResult:
    skipped = skip_without_tensorrt("benchmarking engines", job)
    if skipped:
        return skipped
    built = engines_built(job)
    if not built:
        return no_engine("bench", job)
    from pipeline.core.fileio import write_json
    from pipeline.core.samples import make_inputs
    from trt.bench import bench, plot

    profile = job.settings.profile
    engines = {p.name: job.input("build", f"{p.name}_engine") for p in built}
    result = bench(engines, "trt", make_inputs(profile, seed=seeds.BENCH), profile.build.bench_warmup, profile.build.bench_iterations,
                   on_step=lambda label, done, total: job.status(f"timing {label} {done}/{total}"))
    write_json(job.out / "bench.trt.json", result)
    plot(result, job.out / "bench.trt.png")
    return StageResult({"json": job.out / "bench.trt.json", "png": job.out / "bench.trt.png"}, {k: v["p50_ms"] for k, v in result["models"].items()})


STAGE = Stage(
    "bench", run_bench, reads=("inputs", "dims", "build.bench_warmup", "build.bench_iterations"), inputs=("build.*",), cached=False,
    key_metric=lambda m: ", ".join(f"{p} p50 {v:.3f} ms" for p, v in m.items()),
)
