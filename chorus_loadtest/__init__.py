"""A load test over the public HTTP API, for sizing a deployment.

`chorus-loadtest` (or `manage.py loadtest`) drives a running Chorus at a list of
concurrency levels and reports latency, throughput, failures and resource use
per level. It needs no Django settings and no database: only a URL and a key.
It imports neither Django nor Celery (tests/loadtest/test_isolation.py); its own
dependencies are the `loadtest` extra (`pip install 'chorus[loadtest]'`), which the
web and worker images leave out.

Modules: `options` (what to run), `client` (one request, timed), `runner` (the
levels, with progress), `sampler` (worker memory, GPU), `stats` (percentiles,
growth), `report` (console, Markdown, CSV), `plot` (PNG), `cli` (arguments).
"""
