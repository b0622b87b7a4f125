"""Fixtures of the tune tests."""

import copy
import dataclasses
import json

import pytest

from chunkbench.tune.presearch import server as cal

FITS: dict[str, object] = {}  # this test process's server calibrations, by everything the fit reads


@pytest.fixture
def shared_fits(monkeypatch):
    """The server calibration's fit (about a minute of CPU on the simulated server's runs) once per distinct
    input: the tests of a presearch tune's pipeline (a resume, a saved calibration, repeated verification) fit
    the same runs of the same spec, and the fit is deterministic. A repeat gets a copy of the first's result
    and what the fit writes into the runs; the label of the server it names is the caller's. The cache is this
    process's: under make test's two processes, each that runs one of these tests pays one fit."""
    real = cal.fit

    def fit(runs, spec, device="cpu", server="", num_blocks=None, **options):
        measured = [{k: v for k, v in run.items() if k != "simulated"} for run in runs]
        # not the backend (a FakeServer counts its launches; the fit simulates on a SimBackend of its own)
        what = [measured, repr(dataclasses.replace(spec, n_trials=0, backend=None)), device, num_blocks, options]
        key = json.dumps(what, sort_keys=True, default=repr)
        if key not in FITS:
            FITS[key] = real(copy.deepcopy(runs), spec, device, server, num_blocks, **options)
        calibration = copy.deepcopy(FITS[key])
        for run, fitted in zip(runs, calibration.runs):
            run["simulated"] = fitted["simulated"]
        calibration.runs, calibration.server = runs, server
        return calibration

    monkeypatch.setattr(cal, "fit", fit)
