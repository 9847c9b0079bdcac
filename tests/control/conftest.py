"""Control fixtures: the two-model live fleet (``fleet``, :mod:`live_harness`) and a real
Prometheus (Debian's ``prometheus`` binary) on a loopback port.

``make test`` installs the binary when it is missing and the machine allows it (root with
apt-get); tests that need it skip, with that hint, only where it is absent.

Prometheus is ready in well under a second, but its first scrape comes ~5 s later: the
discovery manager hands targets to the scrape manager at most every 5 s (hard-coded), so an
end-to-end test costs about 6 s plus its own scrapes.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from control_helpers import PrometheusServer, closed_port

from atoll.control.live_fleet import LiveFleet

PROMETHEUS = shutil.which("prometheus")
READY_TIMEOUT_S = 30.0


def _wait_ready(server: PrometheusServer) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            code = server.process.returncode
            raise RuntimeError(f"prometheus exited with code {code}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"prometheus not ready within {READY_TIMEOUT_S:g} s:\n{server.log_tail()}")


@pytest.fixture(scope="module")
def fleet() -> LiveFleet:
    """The two-model fleet of :func:`live_harness.live_fleet`, once per module (a module may
    define a ``fleet`` of its own)."""
    from live_harness import live_fleet

    return live_fleet()


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """``start(targets, scrape_interval="1s")`` starts a Prometheus scraping ``targets``
    (host:port) with a temporary config and storage; every one started is stopped at teardown."""
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not on PATH; `make test` installs Debian's prometheus "
                    "package when run as root with apt-get (or: apt-get install prometheus)")
    binary: str = PROMETHEUS
    servers: list[PrometheusServer] = []

    def start(targets: list[str], scrape_interval: str = "1s") -> PrometheusServer:
        port = closed_port()  # free now; Prometheus binds it next
        root = tmp_path / f"prometheus-{port}"
        root.mkdir()
        config = root / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
            "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": list(targets)}]}],
        }))
        log = root / "prometheus.log"
        with log.open("wb") as fh:
            process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        server = PrometheusServer(f"http://127.0.0.1:{port}", process, log)
        servers.append(server)
        _wait_ready(server)
        return server

    yield start
    for server in servers:
        server.process.terminate()
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)
