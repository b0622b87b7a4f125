"""One module per command group; each command parses its options and calls one library function."""
