"""`tune --backend launch` re-measures its best configurations before it recommends one (tune/verify.py): the
best of many single runs on a noisy server is partly the luckiest. The "launched server" is the simulator at
known constants (tests/tune/servers.py); one of its launches runs lucky, or does not start."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import optuna
import pytest
from rich.console import Console

from chunkbench.tune.report_text import knobs_text, results_table
from chunkbench.tune.run import VERIFIED_FILE, tune_and_report
from chunkbench.tune.verify import best_distinct, measured_rank, spread_over_ties
from tests.tune.servers import TRUTH, FakeServer, make_spec

LUCKY = 3  # the launch that ran 4x faster than the server is: trial 2's, whose configuration is not the best


@dataclasses.dataclass
class LuckyServer(FakeServer):
    def cost(self, config):
        fast = dataclasses.replace(
            TRUTH,
            flops_scale=4 * TRUTH.flops_scale,
            bandwidth_scale=4 * TRUTH.bandwidth_scale,
            step_overhead_s=TRUTH.step_overhead_s / 4,
            seq_overhead_s=TRUTH.seq_overhead_s / 4,
        )
        return (fast if self.launches == LUCKY else self.server_calibration).cost_model(config)


def test_the_winner_is_picked_on_re_measured_figures_and_a_killed_re_measurement_resumes(tmp_path, capsys):
    spec = make_spec(n_trials=4)
    server = LuckyServer(server_calibration=TRUTH, die_at=spec.n_trials + 2)  # dies on the 2nd re-measurement
    with pytest.raises(KeyboardInterrupt):
        tune_and_report(
            dataclasses.replace(spec, backend=server), "lucky", None, tmp_path, 2, progress=False, repeats=3
        )
    assert len(json.loads((tmp_path / VERIFIED_FILE).read_text())["verified"]) == 1

    again = LuckyServer(server_calibration=TRUTH, launches=spec.n_trials + 1)  # its lucky launch is long gone
    tune_and_report(dataclasses.replace(spec, backend=again), "lucky", None, tmp_path, 2, progress=False, repeats=3)
    assert again.launches == spec.n_trials + 2  # only the re-measurement that had not finished

    study = optuna.load_study(study_name="lucky", storage=f"sqlite:///{tmp_path / 'study.db'}")
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    lucky = trials[LUCKY - 1]  # trial 2 ran on launch 3: the best single run, by far
    assert lucky.values[0] == max(t.values[0] for t in trials)
    remeasured = json.loads((tmp_path / VERIFIED_FILE).read_text())["verified"]
    assert len(remeasured) == 2 and all(len(row["repeats"]) == 3 for row in remeasured.values())
    by_trial = {t.number: remeasured[knobs_text(t)] for t in trials if knobs_text(t) in remeasured}
    assert by_trial[lucky.number]["values"][0] < lucky.values[0]  # launched again, it ran at the server's speed
    winner = max(by_trial, key=lambda n: (by_trial[n]["feasible"], by_trial[n]["values"][0]))
    assert winner != lucky.number  # at the server's speed another configuration measures better (seeded TPE)
    toml = (tmp_path / "recommended.toml").read_text()
    assert f"trial {winner} of study 'lucky', the best re-measured on a launched server" in toml
    assert "measured (median of 3 runs): goodput" in toml
    out = capsys.readouterr().out
    assert "one run -> measured (median of 3 runs)" in out and f"winner on measured figures: trial {winner}" in out
    assert "Verified by launching" in (tmp_path / "report.html").read_text()


@dataclasses.dataclass
class FailingServer(FakeServer):
    """A server that does not come up at one launch (`fail_at`): what LaunchBackend raises then."""

    fail_at: int = 0

    @contextlib.contextmanager
    def session(self, config, log=None):
        if self.launches + 1 == self.fail_at:
            self.launches += 1
            raise RuntimeError("the server exited before /health answered")
        with super().session(config, log) as serve:
            yield serve


def test_a_server_that_fails_on_re_measurement_is_left_out(tmp_path, capsys):
    spec = make_spec(n_trials=3)
    server = FailingServer(server_calibration=TRUTH, fail_at=spec.n_trials + 1)  # the best one's relaunch
    tune_and_report(dataclasses.replace(spec, backend=server), "fails", None, tmp_path, 2, progress=False, repeats=1)
    out = capsys.readouterr().out
    assert "could not be re-measured (RuntimeError: the server exited before /health answered); left out" in out
    assert len(json.loads((tmp_path / VERIFIED_FILE).read_text())["verified"]) == 1  # the second one
    assert "the best re-measured on a launched server" in (tmp_path / "recommended.toml").read_text()


def test_a_pareto_front_is_not_re_measured(tmp_path):
    spec = dataclasses.replace(make_spec(n_trials=2), objective="pareto")
    server = FakeServer(server_calibration=TRUTH)
    tune_and_report(dataclasses.replace(spec, backend=server), "front", None, tmp_path, 3, progress=False)
    assert server.launches == spec.n_trials and not (tmp_path / VERIFIED_FILE).exists()
    assert "No trial was re-measured" in (tmp_path / "report.html").read_text()  # nor on a local engine


def test_a_tie_in_simulation_is_verified_on_configurations_that_differ():
    """Four simulated trials within 5% of each other, two at a 512-token budget: the launches go to the best,
    then to the one farthest from it (4096 tokens, 64 seats), then to the tied one farthest from both."""
    budgets, seqs = (
        optuna.distributions.CategoricalDistribution((512, 1024, 4096)),
        optuna.distributions.CategoricalDistribution((64, 128, 256)),
    )
    study = optuna.create_study(direction="maximize")
    for budget, seats, value in [
        (512, 256, 0.662),
        (512, 128, 0.661),
        (1024, 128, 0.660),
        (4096, 64, 0.640),
        (1024, 64, 0.500),
    ]:
        study.add_trial(
            optuna.trial.create_trial(
                value=value,
                params={"max_num_batched_tokens": budget, "max_num_seqs": seats},
                distributions={"max_num_batched_tokens": budgets, "max_num_seqs": seqs},
                constraints={"ttft": -1.0},
                user_attrs={"knobs": {"max_num_batched_tokens": budget, "max_num_seqs": seats}, "metrics": {}},
            )
        )
    spec = make_spec()
    assert [t.number for t in best_distinct(spec, study, 3)] == [0, 1, 2]
    assert [t.number for t in spread_over_ties(spec, study, 3)] == [0, 3, 2]  # 4: 24% behind, not a tie
    assert [t.number for t in spread_over_ties(spec, study, 5)] == [0, 3, 2, 1, 4]


def test_when_no_simulated_trial_met_the_sla_the_closest_misses_are_verified():
    """Nothing met p99 TTFT <= 3 s in simulation: the launches go to the configurations that missed it by the
    least (a miss of a few percent is within a calibration's error), not to the closest one alone."""
    budgets = optuna.distributions.CategoricalDistribution((512, 1024, 2048, 4096))
    study = optuna.create_study(direction="maximize")
    for budget, miss_ms, value in [(512, 900.0, 0.70), (1024, 90.0, 0.60), (2048, 300.0, 0.65), (4096, 30.0, 0.50)]:
        study.add_trial(
            optuna.trial.create_trial(
                value=value,
                params={"max_num_batched_tokens": budget},
                distributions={"max_num_batched_tokens": budgets},
                constraints={"ttft": miss_ms},
                user_attrs={"knobs": {"max_num_batched_tokens": budget}, "metrics": {}},
            )
        )
    spec = make_spec()
    assert [t.number for t in best_distinct(spec, study, 3)] == [3, 1, 2]
    assert [t.number for t in spread_over_ties(spec, study, 3)] == [3, 1, 2]
    assert [t.number for t in spread_over_ties(spec, study, 1)] == [3]
    # and the results table shows them, closest first, and says that none met the SLAs
    console = Console(width=200, record=True)
    console.print(results_table(spec, study, {}))
    text = console.export_text()
    assert "none of 4 trials met the SLAs; the closest" in text
    assert [line.split("│")[1].strip() for line in text.splitlines() if "budget" in line][:3] == ["3", "1", "2"]


def test_re_measured_rows_rank_the_smallest_miss_first_among_misses():
    """Feasible rows by goodput (ties to headroom); misses after them by how much they miss, so the first miss is
    the "closest" the outputs name, not the one with the most goodput."""
    limits = {"ttft": 3000.0}
    rows = {
        "big miss, most goodput": {"feasible": False, "values": [0.9], "constraints": {"ttft": 900.0}},
        "small miss": {"feasible": False, "values": [0.5], "constraints": {"ttft": 30.0}},
        "met, less room": {"feasible": True, "values": [0.6], "constraints": {"ttft": -10.0}},
        "met, more room": {"feasible": True, "values": [0.6], "constraints": {"ttft": -500.0}},
        "met, NaN": {"feasible": True, "values": [None], "constraints": {"ttft": -900.0}},
    }
    assert sorted(rows, key=lambda name: measured_rank(rows[name], limits)) == [
        "met, more room",
        "met, less room",
        "met, NaN",
        "small miss",
        "big miss, most goodput",
    ]
