"""The pipeline stages: config validation, the `lantern` CLI, sweep-point sampling, tables and GPU placement."""
