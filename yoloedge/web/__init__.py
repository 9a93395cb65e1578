"""The daemon's HTTP endpoint: `/metrics` for Prometheus, `/api/status`."""
