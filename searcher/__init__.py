"""Pure, deterministic hyperparameter search methods: events in, actions out."""
