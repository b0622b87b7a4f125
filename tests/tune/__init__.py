"""The tuner and the CI gate."""
