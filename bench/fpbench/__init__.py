"""fencepost's benchmark harness: fencepost (SQLite, PostgreSQL), etcd and Redis
started side by side on loopback, the same workloads against each, one table.

`python bench/run.py --help` is the entry point; `run.run_benchmark()` the same
from Python (the CI smoke test uses it)."""
