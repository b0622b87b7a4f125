"""The tuner: search spaces, SLAs as constraints, objectives, the Optuna study, emitted configs and reports."""
