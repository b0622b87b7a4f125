"""Fake launched servers for the tests of tune --backend launch and --presearch sim: the simulator at known
constants (TRUTH), counting its launches (sessions)."""

from __future__ import annotations

import contextlib
import dataclasses

from chunkbench.backends.sim import SimBackend
from chunkbench.bench.slo import parse_slas
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.presearch.server import designs, simulate_design
from chunkbench.tune.space import SearchSpace
from chunkbench.tune.spec import TuneSpec
from chunkbench.workloads.spec import WorkloadSpec

TRUTH = ServerCalibration("cpu", 0.08, 0.15, 0.008, 0.002, "small", num_blocks=1024)


def make_spec(n_trials: int = 6) -> TuneSpec:
    workload = WorkloadSpec(
        name="synthetic", num_requests=12, rate=2.0, prompt_len="uniform:32:512", output_len="uniform:8:48"
    )
    return TuneSpec(
        model="small",
        slos=parse_slas({"ttft": "3s", "tbt": None, "tpot": None, "e2el": None}, 99.0),
        space=SearchSpace.load("default"),
        workload=workload,
        backend=SimBackend("h100-sxm"),
        n_trials=n_trials,
        engine_overrides={"num_blocks": 1024},
    )


@dataclasses.dataclass
class FakeServer(SimBackend):
    """A 'launched server' that is the simulator at known constants; counts launches, may die at one."""

    launches: int = 0
    die_at: int | None = None  # raise KeyboardInterrupt (a killed tune) when this launch starts
    relaunched = True
    warms_up = True  # as LaunchBackend

    @contextlib.contextmanager
    def session(self, config, log=None):  # `log`: where LaunchBackend would write the server's output
        self.launches += 1
        if self.die_at == self.launches:
            raise KeyboardInterrupt
        with super().session(config) as serve:
            yield serve


# A server whose step cost IS linear (sim/linear_cost.py), with constants of the shape measured on vLLM 0.32's
# CPU engine: a fixed step, a prefill step's extra, per token, per causal attention pair, per sequence, per key,
# a stall every 40 sequences stepped, a step at a token count new to the session (oneDNN building a primitive),
# and the time a token takes to reach the client.
LINEAR_TRUTH = ServerCalibration(
    "cpu",
    family="linear",
    model="small",
    num_blocks=1024,
    coefficients={
        "step_s": 2.0e-3,
        "prefill_step_s": 0.7e-3,
        "token_s": 30e-6,
        "pair_s": 15e-9,
        "seq_s": 50e-6,
        "key_s": 20e-9,
        "stall_s": 1.5e-3,
        "stall_every": 40,
        "new_step_s": 3e-3,
        "latency_s": 5e-3,
    },
)


def truth_runs(spec, truth: ServerCalibration) -> list[dict]:
    """The calibration runs as a server whose step costs are `truth`'s would give them."""
    runs = []
    for design in designs(spec):
        run = {
            "name": design.name,
            "knobs": design.knobs,
            "workload": dataclasses.asdict(design.workload),
            "take": design.take,
            "primer": design.primer,
            "repeat": design.repeat,
            "fitted": list(design.fitted),
            "tails": list(design.tails),
            "warmed_up": True,
        }  # as presearch.server.run_design runs it: after its warm-up, on the same launch
        runs.append(run | simulate_design(truth, spec, run))
    return runs
