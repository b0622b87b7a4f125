"""The calibrated roofline against measured data: Vidur's operator profiles (the subset shipped in
tests/data/gpu-profiles, see its ORIGIN.md) and published serving figures. Each threshold is the calibration's
acceptance number, checked on the data so that a change to the model or the constants can fail it."""

import pytest
from chunkbench.engine.config import EngineConfig, ModelConfig

from chunkbench.backends.sim import SimBackend
from chunkbench.calibration.gpu_kernels import PROFILES, fit, gpu_of, linear_errors, load_rows
from chunkbench.errors import UserError
from chunkbench.sim.cost_model import StepShape
from chunkbench.sim.engine_overhead import engine_overhead, overheads
from chunkbench.sim.gpus import GPUS
from chunkbench.sim.kernel_constants import calibration_for
from chunkbench.sim.roofline import RooflineCostModel
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "gpu-profiles"
ROWS = {gpu_of(DATA / name).name: load_rows(DATA / name) for name in PROFILES}


@pytest.mark.parametrize("gpu", ROWS)
def test_in_sample_linear_time_at_tp1(gpu):
    errors = linear_errors(ROWS[gpu], calibration_for(gpu).constants, GPUS[gpu], 32, 8192)
    assert errors.rows > 200
    assert errors.mean_abs_pct <= 5.0 and errors.max_abs_pct <= 15.0, errors


@pytest.mark.parametrize("fitted, predicted", [("a100-80g", "h100-sxm"), ("h100-sxm", "a100-80g")])
def test_other_gpu_and_model_held_out(fitted, predicted):
    """Each GPU's constants are fitted on its own profile only, so using one GPU's constants on the other's
    rows (with the other GPU's datasheet peaks) is a leave-one-out over GPU and model."""
    errors = linear_errors(ROWS[predicted], calibration_for(fitted).constants, GPUS[predicted], 64, 1024)
    assert errors.rows > 100
    assert errors.mean_abs_pct <= 8.0 and errors.max_abs_pct <= 20.0, errors


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ROWS)
def test_the_fit_reproduces_the_shipped_constants_and_holds_across_tp(gpu):
    constants, _ = fit(ROWS[gpu], GPUS[gpu])
    shipped = calibration_for(gpu).constants
    assert constants.token_tile == shipped.token_tile
    for name in ("gemm_efficiency", "memory_efficiency", "smoothness", "gemm_floor_s"):
        assert getattr(constants, name) == pytest.approx(getattr(shipped, name), rel=1e-3), name
    # Fit on TP 1-2, predict TP 4-8 (no acceptance number in the issue: these bound today's 6.5-8.5% / 23-26%).
    tp12, _ = fit([r for r in ROWS[gpu] if r.tp <= 2], GPUS[gpu])
    errors = linear_errors(ROWS[gpu], tp12, GPUS[gpu], 64, 1024, tp=(4, 8))
    assert errors.mean_abs_pct <= 10.0 and errors.max_abs_pct <= 30.0, errors


def test_the_model_bends_before_the_knee():
    """At 128 tokens the old max(compute, memory) gave 0.65x of the measured A100 layer; the
    calibrated curve must be within 15% of each measured 128- and 512-token row."""
    for gpu, rows in ROWS.items():
        for tokens in (128, 512):
            errors = linear_errors(rows, calibration_for(gpu).constants, GPUS[gpu], tokens, tokens)
            assert errors.max_abs_pct <= 15.0, (gpu, tokens, errors)


LLAMA_2_7B = ModelConfig(
    "llama-2-7b",
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_layers=32,
    num_heads=32,
    num_kv_heads=32,
    head_dim=128,
    max_model_len=4096,
)  # Meta's config.json


def cpp_engine(gpu):
    return RooflineCostModel(LLAMA_2_7B, GPUS[gpu], step_overhead_s=overheads()["trtllm"], engine="trtllm")


# Published batch-1 figures for Llama-2-7B in fp16 on one A100-80GB SXM (seconds), C++ engines:
# - TensorRT-LLM v0.5 "Low Latency" table, 1st token latency, input 2048: 133 ms
#   https://github.com/NVIDIA/TensorRT-LLM/blob/release/0.5.0/docs/source/performance.md
# - lmdeploy v0.1.0a1 static inference benchmark, llama2-7b, batch 1, tp 1: first token latency of a
#   2048-token prompt 0.139 s; per-token latency (50%) of a 1-token prompt 0.009 s and of 128-token prompt 0.010 s
#   https://github.com/InternLM/lmdeploy/blob/main/docs/en/benchmark/a100_fp16.md
PUBLISHED = [
    ("TensorRT-LLM v0.5 TTFT 2048", StepShape(((2048, 0),), (), 1), 0.133),
    ("lmdeploy TTFT 2048", StepShape(((2048, 0),), (), 1), 0.139),
    ("lmdeploy decode step, 1 request", StepShape((), (128,), 1), 0.0095),
]


@pytest.mark.parametrize("name, step, seconds", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_batch1_figures_within_15_percent(name, step, seconds):
    assert cpp_engine("a100-80g").predict(step) == pytest.approx(seconds, rel=0.15)


def test_uncalibrated_gpus_say_so_everywhere():
    config = EngineConfig.create("llama-3-8b")
    for gpu, calibrated in (("h100-sxm", True), ("a100-80g", True), ("l40s", False), ("mi300x", False)):
        cost = RooflineCostModel.for_config(config, GPUS[gpu])
        assert calibration_for(gpu).calibrated is calibrated
        for text in (str(cost), str(SimBackend(gpu))):
            assert ("uncalibrated" in text) is not calibrated, text
            assert "calibrated" in text and "step overhead" in text


def test_engine_overhead_belongs_to_the_engine():
    assert engine_overhead(None) == (overheads()["vllm"], "vllm")
    assert engine_overhead("sglang")[0] < engine_overhead("vllm")[0] < engine_overhead("chunkbench")[0]
    assert engine_overhead("0.8ms") == (pytest.approx(0.8e-3), "0.8 ms")
    config = EngineConfig.create("llama-3-8b")
    decode = StepShape((), (512,), 1)
    vllm = RooflineCostModel.for_config(config, GPUS["h100-sxm"], "vllm")
    sglang = RooflineCostModel.for_config(config, GPUS["h100-sxm"], "sglang")
    assert vllm.predict(decode) - sglang.predict(decode) == pytest.approx(1.1e-3)
    with pytest.raises(UserError, match="--engine-overhead"):
        engine_overhead("fast")
