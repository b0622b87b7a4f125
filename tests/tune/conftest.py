"""Fixtures of the tune tests."""

import pytest

import chunkbench.tune.presearch.linear as linear


@pytest.fixture
def quick_fits(monkeypatch):
    """The linear server calibration's fit at a tenth of its effort (two trust-region rounds of 800 points, 100
    fresh ones: 7 s, not 52, on a presearch's runs of the roofline server, fit error 7.5% against 4.1%): for the
    tests of what a presearch does with a fit (resumes, saved calibrations, a bad fit) and of a fit that holds
    at less effort, not of how close it comes to a truth, which the tests of the fit itself hold at full effort."""
    monkeypatch.setattr(linear, "ROUNDS", 2)
    monkeypatch.setattr(linear, "EVALUATIONS", 800)
    monkeypatch.setattr(linear, "FRESH_EVALUATIONS", 100)
