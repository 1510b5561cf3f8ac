"""The master service: config, database, REST API, experiment/trial lifecycle and the `det` CLI."""
