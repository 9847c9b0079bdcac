"""Make-before-break delivery: additions first, removals once the additions are ready; a
controller killed (SIGKILL, a real process) between the two phases neither loses nor repeats one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from control_helpers import kill_9

from atoll.control.state import load_state

WORKER = Path(__file__).with_name("mbb_worker.py")


def _run(tmp: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), str(tmp / "state"), str(tmp / "plans"),
                             str(tmp / "deliveries.log"), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_between_the_phases_the_restart_delivers_the_removals_once(tmp_path: Path) -> None:
    from mbb_worker import BIG, SMALL

    proc = _run(tmp_path, "phase1")
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "PHASE1":
                break
        else:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the worker ended before phase 1: {err}")
    finally:
        kill_9(proc)
    saved = load_state(tmp_path / "state")
    assert saved is not None and saved.pending is None and saved.final is not None
    assert saved.running == {**saved.final.plan, SMALL.key: 1}  # the replaced instance is still there
    assert [k for k, _, _ in saved.replacing] == [SMALL.key]

    again = _run(tmp_path, "final")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    deliveries = [json.loads(line) for line in (tmp_path / "deliveries.log").read_text().splitlines()]
    sequences = [d["sequence"] for d in deliveries]
    assert sequences == [1, 2, 3], sequences  # initial plan, additions, removals: each once
    first, additions, removals = (d["plan"] for d in deliveries)
    assert first.get(SMALL.key) == 1 and BIG.key not in first
    assert additions.get(SMALL.key) == 1 and additions.get(BIG.key) == 1  # both serve during the swap
    assert removals.get(BIG.key) == 1 and SMALL.key not in removals
    final = load_state(tmp_path / "state")
    assert final is not None and final.running == removals and final.final is None and not final.replacing
    assert [k for k, _, _ in final.draining] in ([SMALL.key], [])  # draining from when BIG was ready
