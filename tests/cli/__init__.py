"""The command line: configs, one-line errors, hardening, fuzzing, packaging."""
