"""Fake launched servers for the tests of tune --backend launch and --presearch sim: the simulator at known
constants (TRUTH), counting its launches (sessions)."""

from __future__ import annotations

import contextlib
import dataclasses

from chunkbench.backends import SimBackend
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.slo import parse_slas
from chunkbench.tune.space import SearchSpace
from chunkbench.tune.spec import TuneSpec
from chunkbench.workload import WorkloadSpec

TRUTH = ServerCalibration("cpu", 0.08, 0.15, 0.008, 0.002, "small", num_blocks=1024)


def make_spec(n_trials: int = 6) -> TuneSpec:
    workload = WorkloadSpec(name="synthetic", num_requests=12, rate=2.0, prompt_len="uniform:32:512",
                            output_len="uniform:8:48")
    return TuneSpec(model="small", slos=parse_slas({"ttft": "3s", "tbt": None, "tpot": None, "e2el": None}, 99.0),
                    space=SearchSpace.load("default"), workload=workload, backend=SimBackend("h100-sxm"),
                    n_trials=n_trials, engine_overrides={"num_blocks": 1024})


@dataclasses.dataclass
class FakeServer(SimBackend):
    """A 'launched server' that is the simulator at known constants; counts launches, may die at one."""

    launches: int = 0
    die_at: int | None = None  # raise KeyboardInterrupt (a killed tune) when this launch starts
    kind = "launch"

    @contextlib.contextmanager
    def session(self, config, log=None):  # `log`: where LaunchBackend would write the server's output
        self.launches += 1
        if self.die_at == self.launches:
            raise KeyboardInterrupt
        with super().session(config) as serve:
            yield serve
