"""``atoll replay``: argument errors, and the JSON document then serving until SIGTERM."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from control_helpers import exported_values

from atoll.control.cli.replay import add_parser, build_exporter
from atoll.control.metrics import PROMPT
from atoll.solvers.errors import InputError


def _args(**kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    argv = ["replay"] + [x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    return parser.parse_args(argv)


def _request_log(tmp_path: Path) -> Path:
    path = tmp_path / "requests.csv"
    rows = ["timestamp,model,input_tokens,output_tokens"]
    rows += [f"{t},a,100,10" for t in range(0, 600, 6)] + [f"{t},b,50,5" for t in range(0, 600, 30)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cli_argument_errors(tmp_path: Path) -> None:
    log = _request_log(tmp_path)
    with pytest.raises(InputError, match="--models names 1 models for 2 workloads"):
        build_exporter(_args(workload=f"csv:{log}#a,csv:{log}#b", models="x"))
    with pytest.raises(InputError, match="starts after the trace ends"):
        build_exporter(_args(workload=f"csv:{log}#a", start_day=3))
    with pytest.raises(InputError, match="workload 'servegen:nope'"):
        build_exporter(_args(workload="servegen:nope"))
    exporter = build_exporter(_args(workload=f"csv:{log}#a,csv:{log}#b", models="llama,phi", step=60))
    assert exporter.models == ("llama", "phi")


def test_cli_json_then_serves_until_sigterm(tmp_path: Path) -> None:
    log = _request_log(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "atoll.control.cli", "replay",
                             "--workload", f"csv:{log}#a,csv:{log}#b", "--models", "m1,m2",
                             "--speedup", "600", "--step", "60", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        text, deadline = "", time.monotonic() + 30
        while not text.rstrip().endswith("\n}") and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:  # raw reads: a buffered readline would hide data from select()
                chunk = os.read(proc.stdout.fileno(), 65536).decode()
                assert chunk, f"replay exited early: {proc.stderr.read().decode() if proc.stderr else ''}"
                text += chunk
        doc = json.loads(text)
        assert [m["model"] for m in doc["models"]] == ["m1", "m2"] and doc["speedup"] == 600
        assert set(exported_values(doc["url"])[PROMPT]) == {"m1", "m2"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
