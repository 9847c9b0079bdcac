"""Request-log timestamps and encodings: each timestamp format and encoding a user's log may
carry, and a Hypothesis fuzz test that only the project's input errors come out of the loader."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atoll.forecast.workloads import WorkloadError, load_request_log
from atoll.solvers.errors import InputError

HEAD = "timestamp,model,input_tokens,output_tokens\n"


def _write(tmp_path: Path, body: str, name: str = "log.csv") -> Path:
    p = tmp_path / name
    p.write_text(HEAD + body, encoding="utf-8")
    return p


def test_utc_offset_with_microseconds_is_kept(tmp_path: Path) -> None:
    # The same instant written with +02:00 and in UTC: one bin, not two bins an hour apart.
    p = _write(tmp_path, "2024-05-01T12:00:00.123456+02:00,a,1,1\n2024-05-01T10:00:00.5+00:00,a,1,1\n")
    s = load_request_log(p, step_s=300)["a"]
    assert len(s) == 1 and s.requests_per_s[0] == pytest.approx(2 / 300)


def test_zoneless_timestamps_are_utc_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        p = _write(tmp_path, "2024-05-01T00:00:00,a,1,1\n2024-05-01T00:00:00Z,a,1,1\n")
        with caplog.at_level(logging.WARNING):
            s = load_request_log(p, step_s=300)["a"]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert len(s) == 1 and s.requests_per_s[0] == pytest.approx(2 / 300)  # same instant
    assert "read as UTC" in caplog.text and "line 2" in caplog.text


def test_seconds_mixed_with_milliseconds_is_an_error_not_an_allocation(tmp_path: Path) -> None:
    p = _write(tmp_path, "1714557600,a,1,1\n1714557600123,a,1,1\n")
    with pytest.raises(WorkloadError, match=r"log.csv:3: .*milliseconds"):
        load_request_log(p)
    p = _write(tmp_path, "0,a,1,1\n99999999999,a,1,1\n", "span.csv")
    with pytest.raises(WorkloadError, match="mixed with other units"):
        load_request_log(p)


@pytest.mark.parametrize("stamp", ["nan", "inf", "-inf", "NaN"])
def test_non_finite_timestamps_are_named(tmp_path: Path, stamp: str) -> None:
    p = _write(tmp_path, f"0,a,1,1\n{stamp},a,1,1\n")
    with pytest.raises(WorkloadError, match=r"log.csv:3: malformed row .*finite"):
        load_request_log(p)


def test_non_utf8_file_is_named(tmp_path: Path) -> None:
    p = tmp_path / "latin.csv"
    p.write_bytes(HEAD.encode() + "0,modèle,1,1\n".encode("latin-1"))
    with pytest.raises(WorkloadError, match=r"latin.csv: not UTF-8 text .*save the log as UTF-8"):
        load_request_log(p)


def test_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    p = tmp_path / "bom.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (HEAD + "0,a,1,1\n").encode())
    assert set(load_request_log(p)) == {"a"}
    p.write_bytes(b"\xef\xbb\xbftime,model,input_tokens,output_tokens\n0,a,1,1\n")
    with pytest.raises(WorkloadError) as info:
        load_request_log(p)
    assert "\ufeff" not in str(info.value) and "'time'" in str(info.value)


def test_a_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="is not a file"):
        load_request_log(tmp_path)


def test_parsed_once_for_several_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from atoll.forecast import workloads

    p = _write(tmp_path, "0,a,1,1\n10,b,2,2\n20,c,3,3\n")
    calls = []
    real = workloads._parse_time
    monkeypatch.setattr(workloads, "_parse_time", lambda t: calls.append(t) or real(t))
    for m in "abc":
        workloads.load_workload(f"csv:{p}#{m}")
    assert len(calls) == 3  # one parse of three rows, not three


_cell = st.one_of(st.text(max_size=12), st.floats(allow_nan=True, allow_infinity=True).map(str),
                  st.integers(-10**15, 10**15).map(str),
                  st.datetimes().map(lambda d: d.isoformat()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_cell, _cell, _cell, _cell), max_size=6),
       raw=st.binary(max_size=40), header=st.booleans())
def test_fuzz_only_input_errors(tmp_path: Path, rows: list[tuple[str, ...]], raw: bytes,
                                header: bool) -> None:
    body = "".join(",".join(r) + "\n" for r in rows).encode("utf-8", "surrogatepass")
    p = tmp_path / "fuzz.csv"
    p.write_bytes((HEAD.encode() if header else b"") + body + raw)
    try:
        out = load_request_log(p, step_s=60)
    except InputError:
        return
    for s in out.values():
        assert np.all(np.isfinite(s.requests_per_s))
