"""Fuzz targets shared by the Hypothesis tests (a few hundred examples each in ``make test``) and
``benchmarks/fuzz.py`` (>= 20,000 each): hostile input in, and only the project's own errors
(:class:`atoll.solvers.errors.AtollError` subclasses) may come out."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from atoll.control.metrics import (
    GENERATION,
    METRIC_NAMES,
    PROMPT,
    START_TIME,
    _query_result,
    assemble,
    exposition_samples,
    prometheus_snapshot,
)
from atoll.control.rates import RateTracker
from atoll.solvers.catalog import load_user_file

# ----- the user catalog file ------------------------------------------------------------------------

FIELDS = ("name", "memory_gb", "hbm_bandwidth_gbs", "bf16_tflops", "link_gbs", "layers", "hidden", "heads",
          "kv_heads", "head_dim", "params_b", "active_params_b", "bytes_per_param", "slo", "aliases",
          "experts", "active_experts", "ttft_ms", "tpot_ms", "gpus", "models")
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["phi-4", "MI300X", "H100", "nan", "1e400"]))
keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=6), st.integers(-3, 3))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(keys, inner, max_size=6)),
                      max_leaves=25)
entries = st.dictionaries(st.sampled_from(FIELDS), values, max_size=12)
documents = st.one_of(
    st.fixed_dictionaries({}, optional={"gpus": st.one_of(st.lists(entries, max_size=3), values),
                                        "models": st.one_of(st.lists(entries, max_size=3), values)}),
    values)
catalog_inputs = st.one_of(documents.map(lambda d: ("yaml", d)),
                           st.binary(max_size=200).map(lambda b: ("raw", b)),
                           st.text(max_size=200).map(lambda t: ("text", t)))


class CatalogTarget:
    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self.root = Path(self._dir.name)

    def __call__(self, item: tuple[str, Any], suffix: str = ".yaml") -> None:
        kind, data = item
        path = self.root / f"user{suffix}"
        if kind == "yaml":
            try:
                text = yaml.safe_dump(data, sort_keys=False)
            except (yaml.YAMLError, ValueError, RecursionError):
                return  # not representable: nothing to load
            path.write_text(text)
        elif kind == "raw":
            path.write_bytes(data)
        else:
            path.write_text(data, errors="surrogatepass")
        load_user_file(path)


# ----- /metrics pages --------------------------------------------------------------------------------

names = st.sampled_from([*METRIC_NAMES, START_TIME, "vllm:other", "vllm:", PROMPT + "x"])
label_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
sample_values = st.one_of(st.sampled_from(["+Inf", "-Inf", "NaN", "nan", "1e400", "-0", "0x10", "", "1_0"]),
                          st.floats(allow_nan=True).map(repr), st.integers(-10**20, 10**20).map(str),
                          st.text(max_size=5))


@st.composite
def sample_lines(draw: st.DrawFn) -> str:
    name = draw(names)
    labels = draw(st.dictionaries(st.sampled_from(["model_name", "engine", "instance", "job", "x"]),
                                  label_text, max_size=3))
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    sep = draw(st.sampled_from([" ", "  ", "\t", ""]))
    return f"{name}{{{body}}}{sep}{draw(sample_values)}" if labels or draw(st.booleans()) \
        else f"{name}{sep}{draw(sample_values)}"


pages = st.one_of(
    st.lists(st.one_of(sample_lines(),
                       st.sampled_from([f"# TYPE {PROMPT} counter", f"# TYPE {GENERATION} gauge",
                                        "# HELP x y", "#", ""]),
                       st.text(max_size=20)),
             max_size=12).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")),
    st.binary(max_size=300))


def metrics_target(pages_: list[bytes]) -> None:
    """Two reads of one endpoint through the parser, the snapshot and the rate tracker."""
    tracker = RateTracker()
    for i, body in enumerate(pages_):
        raw, times, starts, problems = exposition_samples(body, "http://x/metrics", 10.0 * (i + 1))
        snapshot = assemble(raw, times, 10.0 * (i + 1), "http://x/metrics", problems=problems, starts=starts)
        tracker.update(snapshot)
        json.dumps(snapshot.as_dict(), allow_nan=False)


# ----- Prometheus API answers ------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
                         st.sampled_from(["NaN", "+Inf", "1e400", "12", "abc"]))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=12)
label_sets = st.dictionaries(st.sampled_from(["__name__", "model_name", "instance", "job", "engine"]),
                             st.one_of(st.sampled_from([*METRIC_NAMES, START_TIME, "m", "h:1"]), label_text,
                                       json_values), max_size=5)
items = st.one_of(
    st.fixed_dictionaries({}, optional={"metric": st.one_of(label_sets, json_values),
                                        "value": st.one_of(st.tuples(json_scalars, json_scalars).map(list),
                                                           json_values)}),
    json_values)
answers = st.one_of(
    st.builds(lambda result, kind, status: {"status": status, "data": {"resultType": kind, "result": result}},
              st.one_of(st.lists(items, max_size=8), json_values), st.sampled_from(["vector", "matrix", "x"]),
              st.sampled_from(["success", "error"])),
    json_values)
bodies = st.one_of(answers.map(lambda a: json.dumps(a).encode()), st.binary(max_size=200))


def prometheus_target(three: tuple[bytes, bytes, bytes]) -> None:
    url = "http://p/api/v1/query"
    values, stamps, starts = (_query_result(b, url) for b in three)
    snapshot = prometheus_snapshot(values, stamps, starts, 60.0, url)
    RateTracker().update(snapshot)
    json.dumps(snapshot.as_dict(), allow_nan=False)
    assert all(math.isfinite(s.time_s) for mm in snapshot.models.values() for s in mm.series)
