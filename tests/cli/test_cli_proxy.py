"""`fencepost pool set` for proxy mode (SPEC §4.7): the upstream's URL and
credentials, the values read from the environment or a file and never taken
from the command line, and shown back by name only."""

from __future__ import annotations

from pathlib import Path

import httpx
from proxy_upstreams import Upstream

from cli_support import assert_clean_failure, cli_env, fp, fp_json
from support import ServerProcess, unique_name

SECRET = "sk-cli-secret-987654321"


def test_pool_set_configures_the_upstream_from_env_and_file(
        server: ServerProcess, tmp_path: Path) -> None:
    upstream = Upstream()
    try:
        secret_file = tmp_path / "org-id"
        secret_file.write_text("org-42\n")
        name = unique_name("cliproxy")
        env = cli_env(server, OPENAI_AUTH=f"Bearer {SECRET}")
        out = fp("pool", "set", name, "--limit", "2", "--upstream-url", upstream.url + "/v1",
                 "--upstream-header", "Authorization=env:OPENAI_AUTH",
                 "--upstream-header", f"OpenAI-Organization=file:{secret_file}",
                 "--upstream-timeout-ms", "5000", "--max-body-bytes", "1048576", env=env)
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr and "org-42" not in out.stdout + out.stderr
        assert "Authorization, OpenAI-Organization" in out.stdout + out.stderr
        shown = fp_json("pool", "show", name, env=env)
        assert shown["upstream"] == {"base_url": upstream.url + "/v1",
                                     "headers": ["Authorization", "OpenAI-Organization"],
                                     "timeout_ms": 5000}
        assert shown["max_body_bytes"] == 1048576
        resp = httpx.get(f"{server.base_url}/v1/pools/{name}/proxy/echo",
                         headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=10)
        sent = dict((k.lower(), v) for k, v in resp.json()["headers"])
        assert sent["authorization"] == f"Bearer {SECRET}"
        assert sent["openai-organization"] == "org-42"  # the file's newline dropped
        assert resp.json()["path"] == "/v1/echo"
        # Only the timeout changes; the credentials stay.
        assert fp("pool", "set", name, "--upstream-timeout-ms", "9000", env=env).returncode == 0
        assert fp_json("pool", "show", name, env=env)["upstream"]["headers"] == \
            ["Authorization", "OpenAI-Organization"]
        # --no-upstream turns proxy mode off.
        assert fp("pool", "set", name, "--no-upstream", env=env).returncode == 0
        assert fp_json("pool", "show", name, env=env)["upstream"] is None
    finally:
        upstream.close()


def test_a_secret_on_the_command_line_is_refused_unsent(server: ServerProcess) -> None:
    name = unique_name("clisecret")
    env = cli_env(server)
    for header in (f"Authorization=Bearer {SECRET}", f"Authorization: {SECRET}",
                   "Authorization=env:NO_SUCH_VARIABLE_HERE", "Authorization=file:/nope/x",
                   "=env:HOME"):
        out = fp("pool", "set", name, "--limit", "1", "--upstream-url", "http://127.0.0.1:9",
                 "--upstream-header", header, env=env)
        assert_clean_failure(out, 2)
        assert SECRET not in out.stderr, out.stderr
    assert fp("pool", "show", name, env=env).returncode == 5  # nothing was made
    both = fp("pool", "set", name, "--limit", "1", "--no-upstream",
              "--upstream-url", "http://127.0.0.1:9", env=env)
    assert_clean_failure(both, 2)
