"""The simulator: the real scheduler on a virtual clock with modelled step times."""

import pytest
from chunkbench.engine.config import EngineConfig, ModelConfig

from chunkbench.backends.engine import EngineBackend
from chunkbench.backends.sim import SimBackend
from chunkbench.bench.runs import compare, run_benchmark
from chunkbench.calibration.profile import profile_path, run_profile
from chunkbench.errors import UserError
from chunkbench.sim.cost_model import StepShape
from chunkbench.sim.fitted import FEATURE_NAMES, FittedCostModel, features
from chunkbench.sim.gpus import GPUS
from chunkbench.sim.roofline import RooflineCostModel
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.conftest import run_cli

LLAMA_8B = ModelConfig.from_name("llama-3-8b")
H100 = SimBackend("h100-sxm")


def prefill(tokens, context=0):
    return StepShape(((tokens, context),), (), 1)


def decodes(batch, context):
    return StepShape((), (context,) * batch, batch)


def test_same_inputs_give_bit_identical_results():
    workload = build_workload(WorkloadSpec(name="rag-mix", num_requests=150, rate=6.0, seed=3))
    config = EngineConfig.create("llama-3-8b", policy="chunked", max_num_batched_tokens=512)
    a = run_benchmark(config, workload, backend=H100, progress=False)
    b = run_benchmark(config, workload, backend=H100, progress=False)
    assert a.summary == b.summary
    assert [r.token_times for r in a.result.requests] == [r.token_times for r in b.result.requests]


@pytest.mark.parametrize("gpu", GPUS)
def test_linear_time_grows_with_tokens_and_shows_the_tile_step(gpu):
    cost = RooflineCostModel(LLAMA_8B, GPUS[gpu])
    times = [cost.predict(prefill(t)) for t in (1024, 1025, 1088, 2048)]
    assert times[0] < times[1] and times[3] > times[0]
    # 1025..1088 tokens fill the same GEMM tiles: only attention grows inside a tile, the tile edge jumps.
    assert times[2] - times[1] < 0.5 * (times[1] - times[0])
    assert times[1] / times[0] > 1.01


def test_tile_step_at_256_on_h100():
    cost = RooflineCostModel(LLAMA_8B, GPUS["h100-sxm"])
    assert cost.predict(prefill(257)) > 1.05 * cost.predict(prefill(256))


def test_decode_time_grows_with_batch_context():
    cost = RooflineCostModel(LLAMA_8B, GPUS["h100-sxm"])
    assert cost.predict(decodes(32, 1024)) < cost.predict(decodes(32, 4096)) < cost.predict(decodes(32, 16384))
    assert cost.predict(decodes(8, 4096)) < cost.predict(decodes(64, 4096))
    # Decoding is memory-bound: 64 sequences cost far less than 64 times one.
    assert cost.predict(decodes(64, 512)) < 3 * cost.predict(decodes(1, 512))


def test_kv_capacity_from_gpu_memory():
    cost = RooflineCostModel(LLAMA_8B, GPUS["h100-sxm"])
    # 80 GB * 0.9 - 16 GB of weights - the activation peak of a 2048-token profiling step (about 0.23 GB: the
    # MLP's three [2048, 14336] bf16 buffers); a 16-token block of llama-3-8b is 2 MiB in bf16.
    config = EngineConfig.create(LLAMA_8B, block_size=16, gpu_memory_utilization=0.9)
    activations = cost.profile_activation_bytes(config)
    assert 0.2e9 < activations < 0.3e9
    assert cost.kv_blocks(config) == int(
        (80e9 * 0.9 - LLAMA_8B.num_params * 2 - activations) // (2 * 32 * 16 * 1024 * 2)
    )
    with pytest.raises(UserError, match="does not fit"):
        RooflineCostModel(ModelConfig.from_name("llama-3-70b"), GPUS["h100-sxm"]).kv_blocks(
            EngineConfig.create("llama-3-70b", block_size=16, gpu_memory_utilization=0.9)
        )


def test_chunked_beats_continuous_on_p99_itl_for_rag_mix():
    workload = build_workload(WorkloadSpec(name="rag-mix", num_requests=300, rate=5.0))
    base = dict(model="llama-3-8b")
    continuous, chunked = compare(base, ["continuous", "chunked:budget=512"], workload, backend=H100, progress=False)
    assert chunked.summary["p99_itl_ms"] < continuous.summary["p99_itl_ms"]
    assert chunked.summary["longest_stall_ms"] < continuous.summary["longest_stall_ms"]
    assert chunked.summary["completed"] == continuous.summary["completed"] == 300


def test_fitted_model_recovers_known_costs_and_round_trips(tmp_path):
    costs = {"step": 0.002, "tokens": 1e-4, "prefill_attention_pairs": 3e-9, "decode_keys": 2e-7}
    true = [costs.get(name, 0.0) for name in FEATURE_NAMES]
    shapes = [prefill(q, c) for q in (16, 64, 256, 1024) for c in (0, 512)] + [
        decodes(b, c) for b in (1, 8, 32) for c in (128, 2048)
    ]
    seconds = [sum(w * f for w, f in zip(true, features(s))) for s in shapes]
    fitted = FittedCostModel.fit_steps(shapes, seconds, model_name="m", device="d", num_blocks=99)
    assert fitted.fit["max_abs_error_pct"] < 1.0
    fitted.save(tmp_path / "p.json")
    loaded = FittedCostModel.load(tmp_path / "p.json")
    assert loaded == fitted
    config = EngineConfig.create("tiny")
    with SimBackend(cost_model=str(tmp_path / "p.json")).session(config) as serve:  # a sim engine per run
        assert serve([]).num_kv_blocks == 99
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="--cost-model"):
        FittedCostModel.load(tmp_path / "bad.json")


def test_simulated_requests_never_sleep_and_respect_arrivals():
    workload = build_workload(WorkloadSpec(name="azure-conv", num_requests=200))
    run = run_benchmark(EngineConfig.create("llama-3-8b"), workload, backend=H100, progress=False)
    assert run.summary["completed"] == 200
    assert run.result.wall_seconds < run.result.duration  # 200 trace requests span minutes of virtual time
    for record, w in zip(run.result.requests, workload):
        assert record.arrival_time == pytest.approx(w.arrival_time)
        assert record.token_times[0] > record.arrival_time and len(record.token_times) == w.output_len


@pytest.mark.slow
@pytest.mark.timing  # a neighbour test process on the other core moves this thread's CPU time (cache, memory)
def test_profiled_simulator_tracks_the_real_engine(tmp_path):
    """Acceptance 1, reduced (the full table is scripts/sim_fidelity.py): profile `small` on this machine over a
    coarse grid, then run the same chat-like requests through the real engine and through the simulator it
    calibrates. Both time steps in this thread's CPU time on one torch thread (engine.CpuClock, as the gate):
    in wall time CI once saw the real median TTFT 1.75x the simulated one, the profile and the run having met
    different loads (and the CI machine may have another core count). Tolerance 30%, means not medians:
    on one thread this CPU runs 2 or 3 decodes slower than 4 (the GEMM kernel changes), which the linear cost
    model can only average, and a median of 8 TTFTs flips between an idle and a busy engine. Even CPU time
    moves on this shared VM (one profile's repeated timings spread 67%): a miss, or a profile that fits worse
    than 15%, is retried with a fresh profile, three tries in all. A simulator off by 1.5x fails all three."""
    # max_model_len: the longest request (1024 + 48 tokens) and no more: the profile's grid spans the context
    config = EngineConfig.create(
        "small", device="cpu", policy="chunked", max_num_batched_tokens=256, max_model_len=1088
    )
    workload = build_workload(
        WorkloadSpec(
            name="synthetic",
            num_requests=8,
            rate=0.5,
            seed=3,
            prompt_len="lognormal:256:0.6:16:1024",
            output_len="fixed:48",
        ),
        1088,
    )
    path = tmp_path / "cpu-small.json"
    misses = []
    for _ in range(3):
        cost, _ = run_profile(config, repeats=3, max_chunk=256, progress=False, cpu_time=True)
        assert cost.idle_factor == 1.0  # CPU-time runs never sleep: nothing goes cold
        if cost.fit["mean_abs_error_pct"] >= 15:  # a profile taken in a noisy spell (once: timings spread 67%)
            misses = [("profile fit", cost.fit)]
            continue
        cost.save(path)
        real = run_benchmark(config, workload, backend=EngineBackend(cpu_time=True), progress=False).summary
        sim = run_benchmark(config, workload, backend=SimBackend(cost_model=str(path)), progress=False).summary
        misses = [
            (key, real[key], sim[key])
            for key in ("mean_ttft_ms", "output_throughput", "mean_itl_ms")
            if sim[key] != pytest.approx(real[key], rel=0.30)
        ]
        if not misses:
            break
    assert not misses, misses


def test_profile_in_cpu_time_on_one_thread(tmp_path, capsys):
    import torch

    threads = torch.get_num_threads()
    # 256-token chunks, the median of 3: a 64-token prefill of `tiny` is ~1 ms, and one repeat of it once fitted
    # no per-token cost at all (a 16- and a 64-token prefill predicted equal)
    code, out, _ = run_cli(
        [
            "profile",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--cpu-time",
            "--repeats",
            "3",
            "--max-chunk",
            "256",
            "--max-model-len",
            "512",
            "--no-progress",
            "--out",
            str(tmp_path / "p.json"),
        ],
        capsys,
    )
    assert code == 0, out
    loaded = FittedCostModel.load(tmp_path / "p.json")
    assert loaded.idle_factor == 1.0 and loaded.predict(prefill(256)) > loaded.predict(prefill(16)) > 0
    assert loaded.clock == "cpu"  # recorded, and saved apart from wall-time profiles by default:
    assert profile_path("cpu", "tiny", loaded.clock) != profile_path("cpu", "tiny")
    assert torch.get_num_threads() == threads  # one thread only while profiling
