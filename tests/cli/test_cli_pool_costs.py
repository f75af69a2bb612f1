"""A pool's unit budget from the command line (SPEC §4.6)."""

from __future__ import annotations

import sys

from cli_support import assert_clean_failure, cli_env, fp, fp_json
from support import ServerProcess, unique_name


def test_pool_set_and_show_the_budget(server: ServerProcess) -> None:
    env = cli_env(server)
    pool = unique_name("pool")
    made = fp_json("pool", "set", pool, "--limit", "5", "--cost-per-minute", "90000", env=env)
    assert made["cost_per_minute"] == 90_000
    shown = fp("pool", "show", pool, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "cost per minute" in shown.stdout and "90000" in shown.stdout
    cleared = fp_json("pool", "set", pool, "--no-cost-budget", env=env)
    assert cleared["cost_per_minute"] is None
    both = fp("pool", "set", pool, "--cost-per-minute", "5", "--no-cost-budget", env=env)
    assert_clean_failure(both, 2)
    assert_clean_failure(fp("pool", "set", pool, "--cost-per-minute", "0", env=env), 2)


def test_run_spends_a_cost_of_the_pool_s_budget(server: ServerProcess) -> None:
    env = cli_env(server)
    pool = unique_name("pool")
    fp_json("pool", "set", pool, "--limit", "5", "--cost-per-minute", "60000", env=env)
    done = fp("run", "--pool", pool, "--cost", "10000", "--", sys.executable, "-c", "",
              env=env)
    assert done.returncode == 0, done.stderr
    # Ten seconds of the budget are spoken for: busy.
    busy = fp("run", "--pool", pool, "--cost", "1", "--", sys.executable, "-c", "", env=env)
    assert busy.returncode == 3, busy.stderr
    assert_clean_failure(fp("run", "--lock", unique_name(), "--cost", "5", "--", "true",
                            env=env), 2)
