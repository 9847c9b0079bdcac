"""The counts format: requests per interval and model, streamed into the same
series the per-request log gives; its errors; one parse per file; re-binning of any interval."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atoll.forecast import counts
from atoll.forecast.counts import csv_format, load_counts, load_csv
from atoll.forecast.workloads import WorkloadError, load_request_log, load_workload
from atoll.solvers.errors import InputError

T0 = 1714521600  # 2024-05-01T00:00:00Z, a minute boundary
MEANS = "timestamp,model,requests,mean_input_tokens,mean_output_tokens\n"
TOTALS = "timestamp,model,requests,input_tokens,output_tokens\n"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _request_log(tmp_path: Path, seed: int = 7) -> tuple[Path, np.ndarray, list[str], np.ndarray, np.ndarray]:
    """A per-request log of three models over ~5 h (the first request at T0; model c starts
    2 h later, on no step boundary)."""
    rng = np.random.default_rng(seed)
    rows = []
    for model, n, start in (("a", 900, 0.0), ("b", 400, 0.0), ("c", 300, 7290.0)):
        t = np.sort(start + rng.uniform(0, 5 * 3600 - start, n))
        for x in t:
            rows.append((float(x), model, float(rng.integers(1, 4000)), float(rng.integers(1, 900))))
    rows.append((0.0, "a", 100.0, 10.0))  # the first request, exactly at T0
    order = rng.permutation(len(rows))
    p = tmp_path / "requests.csv"
    with p.open("w") as fh:
        fh.write("timestamp,model,input_tokens,output_tokens\n")
        for i in order:
            t, m, a, b = rows[i]
            fh.write(f"{T0 + t!r},{m},{a:g},{b:g}\n")
    arr = np.array([(r[0], r[2], r[3]) for r in rows])
    return p, arr[:, 0], [r[1] for r in rows], arr[:, 1], arr[:, 2]


def _counts_file(tmp_path: Path, times: np.ndarray, models: list[str], ins: np.ndarray, outs: np.ndarray,
                 *, means: bool, shuffle: bool, interval: float = 60.0, name: str = "counts.csv") -> Path:
    """The same requests as per-``interval`` counts (ISO 8601 times), with idle intervals as
    explicit zero rows (empty means) in the mean variant."""
    minute = np.floor(times / interval).astype(int)
    last = int(minute.max())
    lines = []
    for m in sorted(set(models)):
        sel = np.array([x == m for x in models])
        for k in range(last + 1):
            hit = sel & (minute == k)
            n = int(hit.sum())
            if n == 0 and not means:
                continue
            t = _iso(T0 + k * interval)
            if means:
                mi = "" if n == 0 else repr(float(ins[hit].mean()))
                mo = "" if n == 0 else repr(float(outs[hit].mean()))
                lines.append(f"{t},{m},{n},{mi},{mo}\n")
            else:
                lines.append(f"{t},{m},{n},{ins[hit].sum():g},{outs[hit].sum():g}\n")
    if shuffle:
        rng = np.random.default_rng(3)
        lines = [lines[i] for i in rng.permutation(len(lines))]
        # the first row off the 300 s grid of the earliest time: the loader must bin again
        off_grid = [_iso(T0 + k * interval) for k in range(last + 1) if (k * interval) % 300]
        first = next(i for i, x in enumerate(lines) if x.split(",")[0] in off_grid)
        lines.insert(0, lines.pop(first))
    p = tmp_path / name
    p.write_text((MEANS if means else TOTALS) + "".join(lines))
    return p


@pytest.mark.parametrize("means", [True, False], ids=["means", "totals"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["sorted", "shuffled"])
def test_streaming_counts_equal_the_per_request_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   means: bool, shuffle: bool) -> None:
    # The streaming loader on a small counts file gives the series the
    # per-request loader gives on the equivalent per-request file. Tiny chunks make it stream.
    monkeypatch.setattr(counts, "CHUNK_ROWS", 16)
    req, times, models, ins, outs = _request_log(tmp_path)
    cnt = _counts_file(tmp_path, times, models, ins, outs, means=means, shuffle=shuffle)
    want = load_request_log(req, step_s=300)
    got = load_counts(cnt, step_s=300)
    assert set(got) == set(want) == {"a", "b", "c"}
    for m, w in want.items():
        g = got[m]
        assert g.name == w.name and g.step_s == w.step_s and len(g) == len(w)
        np.testing.assert_allclose(g.requests_per_s, w.requests_per_s, rtol=1e-12, atol=0)
        np.testing.assert_allclose(g.input_tokens, w.input_tokens, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(g.output_tokens, w.output_tokens, rtol=1e-12, atol=1e-9)
    # through a workload name, told apart by the header, as recorded (no scaling)
    assert csv_format(cnt) == "counts" and csv_format(req) == "requests"
    np.testing.assert_array_equal(load_workload(f"csv:{cnt}#c", step_s=300).requests_per_s,
                                  got["c"].requests_per_s)


def test_a_multi_model_file_is_parsed_once_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counts, "CHUNK_ROWS", 4)
    body = "".join(f"{T0 + 60 * k},{m},{k + 1},10,2\n" for k in range(5) for m in "abc")
    p = tmp_path / "multi.csv"
    p.write_text(MEANS + body)
    parsed: list[str] = []
    real_time = counts._parse_time
    monkeypatch.setattr(counts, "_parse_time", lambda t: parsed.append(t) or real_time(t))
    flushes: list[int] = []
    real_flush = counts._Pass.flush

    def flush(self: counts._Pass) -> None:
        flushes.append(self.buffered)
        real_flush(self)

    monkeypatch.setattr(counts._Pass, "flush", flush)
    series = [load_workload(f"csv:{p}#{m}", step_s=300) for m in "abc"]
    assert len(parsed) == 15  # one parse of 15 rows for three models, not three
    assert max(flushes) <= 4 and len(flushes) >= 15 // 4  # rows held a chunk at a time
    for k, s in enumerate(series):
        assert s.name == f"csv:{'abc'[k]}" and len(s) == 1
        assert s.requests_per_s[0] == pytest.approx(sum(range(1, 6)) / 300)
        assert s.input_tokens[0] == pytest.approx(10) and s.output_tokens[0] == pytest.approx(2)


def test_rows_of_one_interval_add_up_and_means_are_request_weighted(tmp_path: Path) -> None:
    p = tmp_path / "servers.csv"
    p.write_text(MEANS + f"{T0},a,1,100,10\n{T0},a,3,300,30\n{T0 + 60},a,0,,\n{T0 + 300},a,2,50,5\n")
    s = load_counts(p)["a"]
    assert len(s) == 2
    assert s.requests_per_s.tolist() == pytest.approx([4 / 300, 2 / 300])
    assert s.input_tokens.tolist() == pytest.approx([(100 + 900) / 4, 50])
    assert s.output_tokens.tolist() == pytest.approx([(10 + 90) / 4, 5])


def test_trailing_idle_intervals_keep_their_steps(tmp_path: Path) -> None:
    p = tmp_path / "idle.csv"
    p.write_text(TOTALS + f"{T0},a,1,5,1\n" + "".join(f"{T0 + 60 * k},a,0,0,0\n" for k in range(1, 11)))
    s = load_counts(p)["a"]
    assert len(s) == 3 and s.requests_per_s.tolist() == pytest.approx([1 / 300, 0, 0])


def test_hourly_counts_are_spread_over_the_steps_they_cover(tmp_path: Path) -> None:
    p = tmp_path / "hourly.csv"
    p.write_text(MEANS + f"{_iso(T0)},a,3600,100,10\n{_iso(T0 + 3600)},a,7200,200,20\n"
                 f"{_iso(T0)},b,1800,10,1\n")
    out = load_counts(p, step_s=300)
    a, b = out["a"], out["b"]
    assert len(a) == len(b) == 24
    assert a.requests_per_s.tolist() == pytest.approx([1.0] * 12 + [2.0] * 12)
    assert a.input_tokens.tolist() == pytest.approx([100] * 12 + [200] * 12)
    # b has one row: it takes the file's interval (a's), and is padded with idle steps
    assert b.requests_per_s.tolist() == pytest.approx([0.5] * 12 + [0.0] * 12)
    assert (a.requests_per_s * 300).sum() == pytest.approx(3600 + 7200)


def test_an_interval_that_does_not_divide_the_step_is_warned_about(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "uneven.csv"
    p.write_text(MEANS + "".join(f"{T0 + 120 * k},a,1,1,1\n" for k in range(10)))
    with caplog.at_level(logging.WARNING, logger="atoll"):
        s = load_counts(p, step_s=300)["a"]
    assert (s.requests_per_s * 300).sum() == pytest.approx(10)
    assert "every 120 s, which does not divide the 300 s step" in caplog.text


HEADER_ERRORS = [
    ("timestamp,model,requests\n", r"bad.csv:1: header lacks column\(s\) \['input_tokens', 'output_tokens'\]"
                                   r".*either mean_input_tokens,mean_output_tokens"),
    ("timestamp,model,requests,mean_input_tokens\n", r"bad.csv:1: header lacks column\(s\) "
                                                     r"\['mean_output_tokens'\]"),
    ("model,requests,input_tokens,output_tokens\n", r"bad.csv:1: header lacks column\(s\) \['timestamp'\]"),
    ("timestamp,model,requests,mean_input_tokens,mean_output_tokens,input_tokens,output_tokens\n",
     r"bad.csv:1: header has both mean columns .* keep one pair"),
]


@pytest.mark.parametrize(("header", "match"), HEADER_ERRORS)
def test_missing_columns_are_named(tmp_path: Path, header: str, match: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(header + f"{T0},a,1,1,1\n")
    with pytest.raises(WorkloadError, match=match):
        load_counts(p)


ROW_ERRORS = [
    (MEANS, f"{T0},a,-3,1,1", r"bad.csv:3: column 'requests': -3 is negative; give a count >= 0"),
    (MEANS, f"{T0},a,many,1,1", r"bad.csv:3: column 'requests': 'many' is not a number; give a count >= 0"),
    (MEANS, f"{T0},a,,1,1", r"bad.csv:3: column 'requests' is empty; give a count >= 0"),
    (MEANS, f"{T0},a,NaN,1,1", r"bad.csv:3: column 'requests' is NaN; give a count >= 0"),
    (MEANS, f"{T0},a,5,nan,1", r"bad.csv:3: column 'mean_input_tokens' is NaN; give a token number >= 0"),
    (MEANS, f"{T0},a,5,1,inf", r"bad.csv:3: column 'mean_output_tokens': 'inf' is not finite"),
    (MEANS, f"{T0},a,5,,1", r"bad.csv:3: column 'mean_input_tokens' is empty; .*only when requests is 0"),
    (TOTALS, f"{T0},a,2,-1,1", r"bad.csv:3: column 'input_tokens': -1 is negative"),
    (TOTALS, f"{T0},a,0,40,1", r"bad.csv:3: .*40 and 1 tokens in an interval of 0 requests"),
    (MEANS, "noon,a,1,1,1", r"bad.csv:3: column 'timestamp': 'noon' is not a time .*ISO 8601"),
    (MEANS, f"{T0}000,a,1,1,1", r"bad.csv:3: column 'timestamp': .*milliseconds"),
    (MEANS, f"{T0 + 86400 * 40000},a,1,1,1", r"bad.csv:3: .*mixed with other units"),
    (MEANS, f"{T0},,1,1,1", r"bad.csv:3: column 'model' is empty"),
    (MEANS, f"{T0},a,1", r"bad.csv:3: 3 fields where the header has 5"),
]


@pytest.mark.parametrize(("header", "row", "match"), ROW_ERRORS)
def test_bad_rows_name_file_line_column_and_fix(tmp_path: Path, header: str, row: str, match: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(header + f"{T0},a,1,1,1\n{row}\n")
    with pytest.raises(WorkloadError, match=match) as info:
        load_workload(f"csv:{p}#a")
    assert isinstance(info.value, InputError)


def test_file_level_errors(tmp_path: Path) -> None:
    p = tmp_path / "what.csv"
    p.write_text("time,model,count\n1,a,1\n")
    with pytest.raises(WorkloadError, match=r"what.csv:1: unknown format, header .*a request log has "
                                            r"the columns .*a counts file timestamp,model,requests"):
        load_csv(p)
    p.write_text(MEANS)
    with pytest.raises(WorkloadError, match="what.csv: no rows after the header"):
        load_counts(p)
    p.write_text(MEANS + f"{T0},a,1,1,1\n{T0 + 450},a,1,1,1\n{T0 + 900},a,1,1,1\n")
    with pytest.raises(WorkloadError, match=r"every 450 s, longer than the 300 s step and not a multiple"):
        load_counts(p)
    p.write_bytes(MEANS.encode() + f"{T0},modèle,1,1,1\n".encode("latin-1"))
    with pytest.raises(WorkloadError, match=r"what.csv: not UTF-8 text"):
        load_counts(p)
    with pytest.raises(FileNotFoundError, match="workload file not found"):
        load_workload(f"csv:{tmp_path / 'nope.csv'}")


_cell = st.one_of(st.text(max_size=10), st.floats(allow_nan=True, allow_infinity=True).map(str),
                  st.integers(-10**15, 10**15).map(str), st.just(""),
                  st.datetimes().map(lambda d: d.isoformat()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.lists(_cell, min_size=0, max_size=6), max_size=6), raw=st.binary(max_size=30),
       means=st.booleans())
def test_fuzz_only_input_errors(tmp_path: Path, rows: list[list[str]], raw: bytes, means: bool) -> None:
    body = "".join(",".join(r) + "\n" for r in rows).encode("utf-8", "surrogatepass")
    p = tmp_path / "fuzz.csv"
    p.write_bytes((MEANS if means else TOTALS).encode() + body + raw)
    try:
        out = load_counts(p, step_s=60)
    except InputError:
        return
    for s in out.values():
        assert np.all(np.isfinite(s.requests_per_s)) and np.all(s.requests_per_s >= 0)
