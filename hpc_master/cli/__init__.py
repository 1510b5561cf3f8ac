"""The `det` command-line interface."""
