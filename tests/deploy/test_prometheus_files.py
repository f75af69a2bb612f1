"""The Prometheus kit in deploy/prometheus/: promtool (Debian's `prometheus`
package) checks the scrape config and the alert rules and runs the rules' unit
tests; and every series the rules use is one a real server exposes, so the
rules cannot drift from the metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from support import ServerProcess, missing, unique_name

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        missing("promtool (.ci/run installs Debian's prometheus)")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120,
                          cwd=PROMETHEUS)


def test_the_scrape_config_is_valid() -> None:
    out = promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_alert_rules_are_valid() -> None:
    out = promtool("check", "rules", "alerts.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "6 rules found" in out.stdout + out.stderr


def test_the_alerts_fire_when_they_should_and_not_before() -> None:
    out = promtool("test", "rules", "alerts.test.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_series_the_rules_use_is_exposed(tmp_path: Path) -> None:
    rules = (PROMETHEUS / "alerts.yml").read_text()
    used = set(re.findall(r"\b(fencepost_[a-z0-9_]*[a-z0-9])\b", rules))
    assert {"fencepost_leases_overdue", "fencepost_store_up", "fencepost_pool_paused",
            "fencepost_store_database_changes_total"} <= used
    server = ServerProcess(tmp_path / "exposed").start()
    try:
        with server.client() as c:  # pool series exist once a pool does
            assert c.put(f"/v1/pools/{unique_name('p')}", json={"limit": 1}).status_code == 201
        text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    finally:
        server.stop()
    exposed = {sample.name for family in text_string_to_metric_families(text)
               for sample in family.samples}
    assert used <= exposed, used - exposed
