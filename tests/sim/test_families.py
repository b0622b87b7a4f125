"""The cost-model families of a server calibration (sim/families.py): a family registered from outside the
package simulates runs and is fitted through the registry alone; `linear` resolves to the CPU server's family
on the cpu reference and to the plain one on a GPU's, whose fit carries none of the CPU server's terms."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pytest

from chunkbench.backends.sim import SimBackend
from chunkbench.errors import UserError
from chunkbench.sim import families
from chunkbench.sim.cost_family import CostFamily
from chunkbench.sim.cost_model import StepShape
from chunkbench.sim.cpu_linear_cost import CPU_LINEAR, CpuLinearStepCost
from chunkbench.sim.linear_cost import LINEAR, STEP_TERMS, LinearStepCost
from chunkbench.sim.roofline_family import ROOFLINE
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.presearch.server import fit
from chunkbench.workloads.spec import WorkloadRequest
from tests.tune.servers import make_spec, truth_runs


@dataclass
class ConstantStep:
    """Every step takes the same time; memory is the reference roofline's."""

    seconds: float
    memory: object
    idle_factor: float = 1.0

    def predict(self, step: StepShape) -> float:
        return self.seconds

    def kv_blocks(self, config) -> int:
        return self.memory.kv_blocks(config)


class ConstantFamily(CostFamily):
    name = "toy-constant"
    fitter = "tests.sim.test_families:fit_constant"

    def check(self, calibration: ServerCalibration) -> None:
        if set(calibration.coefficients or {}) != {"step_s"}:
            raise UserError("server calibration: the toy family stores step_s alone")

    def cost_model(self, calibration, config):
        return ConstantStep(calibration.coefficients["step_s"], calibration.roofline(config))

    def describe(self, calibration) -> str:
        return f"toy: {calibration.coefficients['step_s'] * 1e3:g} ms a step"


def fit_constant(family, runs, spec, device, meta, score, **options):
    """The toy's fitter: a step is the runs' median ITL."""
    itls = [g for run in runs for g in run["itl_ms"]]
    return score(ServerCalibration(device, coefficients={"step_s": 1e-3 * float(np.median(itls))}, **meta))


@pytest.fixture
def toy():
    family = families.register(ConstantFamily())
    yield family
    families.unregister(family.name)


def test_a_registered_family_simulates_a_run_and_round_trips(toy, tmp_path):
    calibration = ServerCalibration(
        "cpu", family=toy.name, model="small", num_blocks=512, coefficients={"step_s": 0.004}
    )
    assert calibration.cost_family is toy and calibration.label() == "toy: 4 ms a step"
    config = make_spec().base_config()
    with SimBackend(server_calibration=calibration).session(config) as serve:
        result = serve([WorkloadRequest(64, 8, 0.01 * i) for i in range(6)], seed=0, warmup_steps=0, progress=False)
    assert result.steps and {s.seconds for s in result.steps} == {0.004}
    assert all(r.ok for r in result.requests)
    calibration.save(tmp_path / "toy.json")
    assert ServerCalibration.load(tmp_path / "toy.json") == calibration
    with pytest.raises(UserError, match="step_s alone"):
        ServerCalibration("cpu", family=toy.name, coefficients={"step_s": 0.004, "seq_s": 1e-4})


def test_the_fit_reaches_a_registered_familys_fitter(toy):
    spec = make_spec()
    truth = ServerCalibration("cpu", family=toy.name, model="small", num_blocks=1024, coefficients={"step_s": 0.004})
    fitted = fit(truth_runs(spec, truth), spec, "cpu", num_blocks=1024, family=toy.name)
    assert fitted.family == toy.name and fitted.coefficients == {"step_s": pytest.approx(0.004)}
    assert fitted.fit_error_pct < 1 and all("simulated" in run for run in fitted.runs)


def test_a_family_name_resolves_with_the_reference_device():
    assert families.resolve("linear", "cpu") is CPU_LINEAR  # every linear calibration written before the split
    assert families.resolve("linear", "h100-sxm") is LINEAR
    assert families.resolve("linear-cpu", "h100-sxm") is CPU_LINEAR  # named, it is what it says
    assert families.resolve("roofline", "cpu") is ROOFLINE
    assert families.fit_name("auto", "cpu") == "linear" and families.fit_name("auto", "a100-80g") == "roofline"
    assert set(families.names()) >= {"roofline", "linear", "linear-cpu"}
    with pytest.raises(UserError, match="unknown family 'cubic'; use roofline, linear or linear-cpu"):
        families.fit_name("cubic", "cpu")

    class Nameless(ConstantFamily):
        name = ""

    with pytest.raises(ValueError, match="needs a name"):
        families.register(Nameless())


PLAIN = {
    "step_s": 2.0e-3,
    "prefill_step_s": 0.7e-3,
    "token_s": 30e-6,
    "pair_s": 15e-9,
    "seq_s": 50e-6,
    "key_s": 20e-9,
    "latency_s": 5e-3,
}


def test_linear_on_a_gpu_has_none_of_the_cpu_servers_terms(tmp_path):
    """The same stored family, `linear`, on a GPU reference prices a step by the six plain terms alone, every
    time; on the cpu reference the first step of a token count also pays new_step_s. A GPU file that carries a
    CPU server's term is refused in one line rather than read without it."""
    config = make_spec().base_config()
    gpu = ServerCalibration("h100-sxm", family="linear", model="small", num_blocks=1024, coefficients=PLAIN)
    cost = gpu.cost_model(config)
    assert type(cost) is LinearStepCost and gpu.coefficients == PLAIN and gpu.step_overhead_s == PLAIN["step_s"]
    step = StepShape(((100, 0),), (300, 40), 3)
    plain = 2.0e-3 + 0.7e-3 + 102 * 30e-6 + 5050 * 15e-9 + 3 * 50e-6 + 340 * 20e-9
    assert [cost.predict(step) for _ in range(3)] == pytest.approx([plain] * 3, rel=1e-12)
    assert cost.decode_step_cost(2)(340) == cost.predict(StepShape((), (300, 40), 2))
    assert "every" not in gpu.label() and "new to the server" not in gpu.label()
    cpu_terms = PLAIN | {"new_step_s": 3e-3}
    cpu = dataclasses.replace(gpu, device="cpu", coefficients=cpu_terms).cost_model(config)
    assert type(cpu) is CpuLinearStepCost
    assert cpu.predict(step) == pytest.approx(plain + 3e-3, rel=1e-12) and cpu.predict(step) == pytest.approx(plain)
    path = tmp_path / "gpu-linear.json"
    path.write_text(
        json.dumps(
            {
                "format": "chunkbench-server-calibration/1",
                "device": "h100-sxm",
                "family": "linear",
                "coefficients": cpu_terms,
            }
        )
    )
    with pytest.raises(UserError, match="the linear family has no term new_step_s") as raised:
        ServerCalibration.load(path)
    assert "\n" not in str(raised.value)
    zeros = dict.fromkeys(CPU_LINEAR.terms + CPU_LINEAR.settings, 0) | PLAIN  # as the CPU family writes them
    path.write_text(
        json.dumps(
            {
                "format": "chunkbench-server-calibration/1",
                "device": "h100-sxm",
                "family": "linear",
                "coefficients": zeros,
            }
        )
    )
    assert ServerCalibration.load(path).coefficients == PLAIN


@pytest.mark.slow
def test_a_gpu_servers_linear_fit_is_plain():
    """Fitted on a GPU reference, `linear` is the plain family: its six step terms and the client latency,
    recovered from runs a linear server gave, with no stall, token-count or first-touch term to shape them."""
    spec = make_spec()
    truth = ServerCalibration("h100-sxm", family="linear", model="small", num_blocks=1024, coefficients=PLAIN)
    fitted = fit(truth_runs(spec, truth), spec, "h100-sxm", num_blocks=1024, family="linear")
    assert fitted.family == "linear" and fitted.cost_family is LINEAR
    assert set(fitted.coefficients) == set(STEP_TERMS) | {"latency_s"}
    assert fitted.fit_error_pct < 3 and fitted.fits
    for name, rel in (("step_s", 0.05), ("token_s", 0.1), ("latency_s", 0.15)):  # what the runs pin best
        assert fitted.coefficients[name] == pytest.approx(PLAIN[name], rel=rel), name
