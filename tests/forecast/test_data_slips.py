"""A user's data that is slightly wrong gives an error or the clean result, never a
silent third figure. Stray rows, copied blocks, gaps and other models' rows, through both
formats of the CSV loaders."""

from __future__ import annotations

import logging
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from atoll.forecast.counts import load_csv, load_csv_checked
from atoll.forecast.logrows import copies
from atoll.forecast.workloads import WorkloadError, load_request_log, load_workload

T0 = 1714521600  # 2024-05-01T00:00:00Z
HEAD = "timestamp,model,input_tokens,output_tokens\n"


def _rows(seed: int = 0, days: float = 2.0, models: tuple[str, ...] = ("a", "b"), rate: float = 0.02
          ) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for m in models:
        n = int(rate * days * 86400)
        for t in np.sort(rng.uniform(0, days * 86400, n)):
            out.append(f"{T0 + t:.3f},{m},{int(rng.integers(50, 900))},{int(rng.integers(5, 300))}\n")
    return out


def _write(tmp_path: Path, rows: list[str], name: str = "log.csv") -> Path:
    p = tmp_path / name
    p.write_text(HEAD + "".join(rows))
    return p


@pytest.mark.parametrize("stray", [0.0, T0 - 30 * 86400, 4102444800.0, T0 + 40 * 86400],
                         ids=["epoch", "month-early", "year-2100", "after"])
def test_one_stray_row_is_dropped_and_named_and_moves_no_clock(tmp_path: Path, stray: float,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    rows = _rows()
    clean = load_request_log(_write(tmp_path, rows, "clean.csv"))
    bad = _write(tmp_path, [*rows[:10], f"{stray},b,10,10\n", *rows[10:]])
    with caplog.at_level(logging.WARNING):
        got = load_request_log(bad)
    for m in ("a", "b"):
        np.testing.assert_array_equal(got[m].requests_per_s, clean[m].requests_per_s)
    assert "line(s) 12" in caplog.text and "dropped" in caplog.text


def test_a_stray_row_of_another_model_never_shapes_the_axis(tmp_path: Path) -> None:
    rows = _rows()
    p = _write(tmp_path, [f"{T0 - 3 * 86400},other,1,1\n", *rows])  # three days early, lots of rows
    p2 = _write(tmp_path, [*[f"{T0 - 3 * 86400 + k},other,1,1\n" for k in range(500)], *rows], "many.csv")
    clean = load_request_log(_write(tmp_path, rows, "clean.csv"))
    for path in (p, p2):
        got = load_csv(path, models=["a", "b"])
        assert set(got) == {"a", "b"}
        np.testing.assert_array_equal(got["a"].requests_per_s, clean["a"].requests_per_s)


def test_two_real_periods_in_one_file_are_an_error_naming_lines(tmp_path: Path) -> None:
    rows = _rows(days=1.0)
    late = [r.replace(r.split(",")[0], f"{float(r.split(',')[0]) + 20 * 86400:.3f}", 1) for r in rows[:50]]
    p = _write(tmp_path, rows + late)
    with pytest.raises(WorkloadError, match=r"log.csv:\d+: the rows form 2 periods"):
        load_request_log(p)


def test_loading_cost_is_bounded_by_the_bulk_not_a_timestamp(tmp_path: Path) -> None:
    rows = _rows(days=1.0)
    for i, stray in enumerate((1.0, 3e9, 9.9e10)):  # the epoch, the year 2065, just under ms
        p = _write(tmp_path, [f"{stray},a,1,1\n", *rows], f"s{i}.csv")
        tracemalloc.start()
        t = time.perf_counter()
        for fmt_path in (p,):
            s = load_request_log(fmt_path, step_s=60)["a"]
        took = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(s) <= 1441 and peak < 50e6 and took < 20


def test_the_counts_format_gets_the_same_axis(tmp_path: Path) -> None:
    body = "".join(f"{T0 + 60 * k},a,{k % 7 + 1},100,10\n" for k in range(3000))
    head = "timestamp,model,requests,mean_input_tokens,mean_output_tokens\n"
    clean = tmp_path / "c.csv"
    clean.write_text(head + body)
    bad = tmp_path / "b.csv"
    bad.write_text(head + "0,a,5,100,10\n" + body)
    (_, s0), = load_csv_checked(clean)[0]
    (_, s1), = (pairs := load_csv_checked(bad))[0]
    np.testing.assert_array_equal(s0.requests_per_s, s1.requests_per_s)
    assert pairs[1].isolated_lines == (2,)


def test_a_log_concatenated_twice_is_read_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = _rows()
    clean = load_request_log(_write(tmp_path, rows, "clean.csv"))
    with caplog.at_level(logging.WARNING):
        twice = load_request_log(_write(tmp_path, rows + rows))
        chunk = load_request_log(_write(tmp_path, rows[:300] + rows[100:300] + rows[300:], "chunk.csv"))
    for got in (twice, chunk):
        np.testing.assert_array_equal(got["a"].requests_per_s, clean["a"].requests_per_s)
    assert "copies line 2" in caplog.text


def test_lone_duplicates_and_runs_of_identical_rows_are_kept() -> None:
    # a busy second of a fixed-length benchmark: identical rows in a run, and an A B A B pattern
    key = np.array([1, 1, 1, 1, 2, 3, 2, 3, 2, 3, 9, 4, 9], dtype=np.int64)
    copied, _, lone = copies(key)
    assert not copied.any() and lone == 8
    key = np.array([1, 2, 3, 4, 1, 2, 3, 4], dtype=np.int64)  # concatenated
    copied, _, _ = copies(key)
    assert copied.tolist() == [False] * 4 + [True] * 4


def test_gaps_are_reported_and_left_out_of_mean_rate(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    rows = _rows(models=("a",), rate=0.05, days=2.0)
    times = np.array([float(r.split(",")[0]) for r in rows])
    hole = (times > T0 + 86400) & (times < T0 + 86400 + 6 * 3600)  # a collector down for 6 h
    p = _write(tmp_path, [r for r, h in zip(rows, hole, strict=True) if not h])
    with caplog.at_level(logging.WARNING):
        _, check = load_csv_checked(p)
    mc = check.model("a")
    assert len(mc.gaps) == 1 and 5.5 <= mc.gaps[0].hours <= 6.1 and "gap" in caplog.text
    assert mc.mean_rate("exclude") == pytest.approx(0.05, rel=0.05)
    assert mc.mean_rate("zero") < 0.95 * mc.mean_rate("exclude")
    scaled = load_workload(f"csv:{p}#a@mean:1")
    active = np.ones(len(scaled), dtype=bool)
    g = mc.gaps[0]
    active[g.first: g.last + 1] = False
    assert np.mean(scaled.requests_per_s[active]) == pytest.approx(1.0, rel=0.01)


def test_a_quiet_model_has_no_gaps(tmp_path: Path) -> None:
    # 1 request per 20 minutes: hours without one are normal, not a collector down
    _, check = load_csv_checked(_write(tmp_path, _rows(models=("a",), rate=1 / 1200, days=3.0)))
    assert check.model("a").gaps == ()
