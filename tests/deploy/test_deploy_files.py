"""The deployment kit in deploy/, checked by each file's own tool: hadolint for
the Dockerfile, docker-compose for the compose file, HAProxy for its config,
systemd-analyze for the unit. The image itself is built only where a container
engine answers (this kind of machine has the docker client and no engine)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import missing

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def tool(name: str, *fallbacks: str) -> str:
    for candidate in (shutil.which(name), *fallbacks):
        if candidate and os.path.exists(candidate):
            return candidate
    venv = Path(sys.executable).parent / name
    if venv.exists():
        return str(venv)
    missing(f"{name} (.ci/run and the test extra install it)")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=DEPLOY,
                          env={**os.environ, **(env or {})})


def test_the_dockerfile_passes_hadolint() -> None:
    out = run(tool("hadolint"), "--failure-threshold", "info", "Dockerfile")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_image_runs_fencepost_as_a_numeric_non_root_user_on_a_volume() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    assert 'ENTRYPOINT ["fencepost", "serve"]' in text
    assert re.search(r'^VOLUME \["/data"\]', text, re.MULTILINE)
    assert "sqlite:////data/" in text


def test_the_compose_file_is_valid() -> None:
    out = run(tool("docker-compose"), "-f", "compose.yaml", "config", "-q",
              env={"FENCEPOST_BOOTSTRAP_KEY": "k" * 40})
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_compose_file_refuses_to_start_without_a_bootstrap_key() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_BOOTSTRAP_KEY"}
    out = subprocess.run([tool("docker-compose"), "-f", "compose.yaml", "config", "-q"],
                         capture_output=True, text=True, timeout=120, cwd=DEPLOY, env=env)
    assert out.returncode != 0
    assert "FENCEPOST_BOOTSTRAP_KEY" in out.stdout + out.stderr


def test_the_balancer_config_is_valid_for_haproxy() -> None:
    out = run(tool("haproxy", "/usr/sbin/haproxy"), "-c", "-f", "haproxy.cfg")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    # verify also checks that ExecStart exists; point it at a binary that does.
    unit = (DEPLOY / "fencepost.service").read_text()
    assert "ExecStart=/usr/local/bin/fencepost serve" in unit
    copy = tmp_path / "fencepost.service"
    copy.write_text(unit.replace("/usr/local/bin/fencepost", "/bin/true"))
    out = run(tool("systemd-analyze"), "verify", str(copy))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.strip() == "", out.stderr


def test_the_systemd_unit_reloads_with_sighup() -> None:
    """`systemctl reload` (logrotate's postrotate) sends SIGHUP, which reopens the
    logs (tests/server/test_log_rotation.py runs a real rotation)."""
    unit = (DEPLOY / "fencepost.service").read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
    assert "systemctl reload fencepost.service" in (DEPLOY / "fencepost.logrotate").read_text()


def test_the_logrotate_file_is_read_by_logrotate(tmp_path: Path) -> None:
    out = run(tool("logrotate", "/usr/sbin/logrotate"), "--debug", "--state",
              str(tmp_path / "state"), "fencepost.logrotate")
    assert out.returncode == 0, out.stdout + out.stderr
    said = out.stdout + out.stderr
    assert "rotating pattern: /var/log/fencepost/*.log" in said, said
    assert "error" not in said.lower(), said


def test_the_image_builds_where_a_container_engine_answers() -> None:
    docker = shutil.which("docker")
    if docker is None or run(docker, "info").returncode != 0:
        pytest.skip("no container engine answers here (docker client only)")
    out = subprocess.run([docker, "build", "-f", "deploy/Dockerfile", "-t", "fencepost:test", "."],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


def test_the_patroni_example_passes_patronis_validator(tmp_path: Path) -> None:
    """deploy/patroni/patroni.yml, checked by `patroni --validate-config` (Debian's
    patroni). The validator also checks that the listen port is free on this
    machine, whose own PostgreSQL holds 5432: the copy checked listens elsewhere."""
    import yaml

    from support import free_port

    config = yaml.safe_load((DEPLOY / "patroni" / "patroni.yml").read_text())
    bootstrap = config["bootstrap"]["dcs"]
    assert bootstrap["synchronous_mode"] is True  # what the operations guide recommends
    text = (DEPLOY / "patroni" / "patroni.yml").read_text()
    checked = tmp_path / "patroni.yml"
    checked.write_text(text.replace("listen: 0.0.0.0:5432", f"listen: 0.0.0.0:{free_port()}"))
    out = run(tool("patroni"), "--validate-config", str(checked))
    assert out.returncode == 0, out.stdout + out.stderr
    # A broken copy is refused, so the check above can fail.
    broken = tmp_path / "broken.yml"
    broken.write_text(checked.read_text().replace("etcd3:", "etcd_three:"))
    assert run(tool("patroni"), "--validate-config", str(broken)).returncode != 0
