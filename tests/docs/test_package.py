"""The sdist and wheel build, and the wheel installed into a fresh venv works
on its own: the `fencepost` entry point runs, the migrations and the /docs
page's style sheet are inside, and `fencepost serve` answers /healthz."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path

import httpx

from doc_examples import ROOT
from support import BOOTSTRAP_KEY, free_port


def test_built_wheel_installs_and_serves(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # --no-isolation: the build backend comes from the test venv (docs extra),
    # so the test needs no network. The wheel is built from the sdist, which
    # proves the sdist complete.
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(dist), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (sdist,) = dist.glob("fencepost-*.tar.gz")
    (wheel,) = dist.glob("fencepost-*.whl")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert any(n.endswith("/LICENSE") for n in names), names
    with zipfile.ZipFile(wheel) as whl:
        inside = whl.namelist()
    # Every migration, SQL and Python alike: one left out of the wheel would
    # simply never run on an installed server.
    migrations = ROOT / "src" / "fencepost" / "store" / "migrations"
    wanted = {f"fencepost/store/migrations/{path.relative_to(migrations)}"
              for path in migrations.glob("*/*") if path.suffix in (".sql", ".py")}
    assert any(name.endswith(".py") for name in wanted)
    assert wanted <= set(inside), sorted(wanted - set(inside))
    assert "fencepost/server/assets/api-docs.css" in inside
    for console_file in ("index.html", "console.js", "console.css"):  # the web console
        assert f"fencepost/server/ui/{console_file}" in inside
    assert any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in inside)

    # A fresh venv that sees the dependencies (from this venv, through a .pth
    # line: its own .pth files, such as the editable fencepost, are not read)
    # and gets fencepost only from the wheel.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "deps-from-test-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(python), "-c", "import fencepost; print(fencepost.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr

    command = venv / "bin" / "fencepost"
    helped = subprocess.run([str(command), "--help"], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=60)
    assert helped.returncode == 0 and "lock" in helped.stdout, helped.stderr

    port = free_port()
    env["FENCEPOST_BOOTSTRAP_KEY"] = BOOTSTRAP_KEY
    server = subprocess.Popen(
        [str(command), "serve", "--store", f"sqlite:///{tmp_path / 'wheel.db'}",
         "--port", str(port)], cwd=tmp_path, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        health = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server.poll() is None:
            try:
                health = httpx.get(f"{base}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert health is not None and health.status_code == 200, server.poll()
        assert health.json()["store"] == "sqlite"
        assert httpx.get(f"{base}/docs", timeout=5).status_code == 200
        for console_path in ("/ui", "/ui/console.js", "/ui/console.css"):
            assert httpx.get(f"{base}{console_path}", timeout=5).status_code == 200
        who = httpx.get(f"{base}/v1/whoami", timeout=5,
                        headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"})
        assert who.status_code == 200 and who.json()["role"] == "admin"  # migrations ran
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
