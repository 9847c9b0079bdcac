"""Fuzz targets shared by the Hypothesis tests (a few hundred examples each in ``make test``) and
``benchmarks/fuzz.py`` (>= 20,000 each): hostile input in, and only the project's own errors
(:class:`atoll.solvers.errors.AtollError` subclasses) may come out. The targets: the user catalog
file, /metrics pages, Prometheus API answers and fleet files."""

from __future__ import annotations

import copy
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
    assemble,
    exposition_samples,
    prometheus_snapshot,
)
from atoll.control.metrics.prometheus import _query_result
from atoll.control.rates import RateTracker
from atoll.envs.fleet_file import read_fleet
from atoll.solvers.catalog import load_user_file
from atoll.solvers.fleet import BUNDLED_DIR, TOP_KEYS, FleetFileError, load_fleet

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


# ----- fleet files -----------------------------------------------------------------------------------

# Valid fleet files the mutations start from: the bundled ones, the README's example (a request log
# and static availability) and the module docstring's (a user GPU, own offers, a pool trace).
FLEET_BASES: tuple[dict[str, Any], ...] = (
    *(yaml.safe_load(p.read_text()) for p in sorted(BUNDLED_DIR.glob("*.yaml"))),
    {"name": "acme", "runtime": "vllm",
     "models": ["Phi-4-14B", {"name": "Acme-8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                              "head_dim": 128, "params_b": 8.0, "active_params_b": 8.0, "bytes_per_param": 2,
                              "slo": {"ttft_ms": 800, "tpot_ms": 40}}],
     "gpus": [],
     "regions": [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4", "L40S"]}],
     "availability": {"static": {"aws:us-east-2/1xL4": 40, "aws:us-east-2/4xL4": 10,
                                 "aws:us-east-2/1xL40S": 20}},
     "workloads": {"Phi-4-14B": {"source": "csv:requests.csv#phi-4", "mean_rate": 2.0},
                   "Acme-8B": {"source": "csv:requests.csv#acme-8b", "scale": 20}},
     "kubernetes": {"namespace": "llm", "model_sources": {"Acme-8B": "acme/acme-8b"}}},
    {"name": "acme", "runtime": "any",
     "models": ["phi-4", {"name": "Acme-8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                          "head_dim": 128, "params_b": 8.0, "active_params_b": 8.0, "bytes_per_param": 2,
                          "aliases": ["acme-8b"], "slo": {"ttft_ms": 800, "tpot_ms": 40}}],
     "gpus": [{"name": "MI300X", "memory_gb": 192, "hbm_bandwidth_gbs": 5300, "bf16_tflops": 1307,
               "link_gbs": 448}],
     "regions": [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4", "L40S"]},
                 {"name": "lab:rack-1", "offers": [{"config": "8xMI300X", "on_demand": 28.0, "spot": 11.0}]}],
     "availability": {"static": {"aws:us-east-2/4xL4": 6},
                      "traces": {"aws:us-east-2/1xL40S": "pools/l40s.csv",
                                 "lab:rack-1/8xMI300X": "rack.csv"}},
     "workloads": {"phi-4": {"source": "csv:requests.csv#phi-4", "scale": 1.0},
                   "acme-8b": {"source": "csv:acme.csv", "mean_rate": 5.0}},
     "kubernetes": {"namespace": "llm", "image": "vllm/vllm-openai:v0.11.0"},
     "n_max": 4, "rho": 8.0},
)
FLEET_KEYS = (*TOP_KEYS, "layers", "hidden", "heads", "kv_heads", "head_dim", "params_b", "active_params_b",
              "bytes_per_param", "slo", "ttft_ms", "tpot_ms", "aliases", "experts", "active_experts", "vocab",
              "precision", "role", "memory_gb", "hbm_bandwidth_gbs", "bf16_tflops", "link_gbs", "family",
              "catalog", "gpu_types", "offers", "config", "on_demand", "spot", "static", "traces", "source",
              "scale", "mean_rate", "Phi-4-14B", "phi-4", "Acme-8B", "acme-8b", "aws:us-east-2/4xL4",
              "lab:rack-1/8xMI300X", "aws:us-east-2/1xL40S", "aws:us-east-2/8xH100")
FLEET_WORDS = ("Phi-4-14B", "phi-4", "Acme-8B", "acme-8b", "GPT-OSS-20B", "L4", "MI300X", "mi300x", "H100",
               "8xMI300X", "4xL4", "3xL4", "0xL4", "08xL4", "9" * 5000 + "xL4", "1x", "aws:us-east-2",
               "aws:mars-1", "lab:x", "csv:requests.csv#phi-4", "csv:requests.csv", "csv:acme.csv",
               "csv:nope.csv#x", "csv:", "csv:#", "csv:pools\x00x", "csv:.", "csv:pools#x",
               "csv:binary.csv#x", "servegen:m-large", "servegen:nope", "azure:nope", ":", "pools/l40s.csv",
               "rack.csv", "bad.csv", "binary.csv", "pools", "", " ", "/", "\x00", "vllm", "any", "core",
               "extended", "yes", "1e400", "nan", "-0")
fleet_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.integers(-10**400, 10**400),
    st.floats(allow_nan=True), st.text(max_size=10), st.dates(), st.datetimes(), st.binary(max_size=4),
    st.sampled_from(FLEET_WORDS))
fleet_keys = st.one_of(st.sampled_from(FLEET_KEYS), st.text(max_size=6), st.integers(-3, 3), st.none(),
                       st.booleans(), st.floats(allow_nan=False))
fleet_values = st.recursive(
    fleet_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(fleet_keys, inner, max_size=5)),
    max_leaves=15)
_numbers = st.one_of(st.sampled_from([0, -1, 1, 2, 3, 4, 8, 2.5, 1e-300, -0.0, float("nan"), float("inf"),
                                      10**400, True, "8", "1e3"]),
                     st.integers(-10, 10**6), st.floats())


def _tweak(draw: st.DrawFn, value: Any) -> Any:
    """A value of (mostly) the same kind: a nearby number, another fleet word, a list with an item
    repeated or dropped, a mapping with a key renamed."""
    if isinstance(value, bool):
        return draw(st.sampled_from([not value, None, "true", "no", 1, []]))
    if isinstance(value, int | float):
        return draw(_numbers)
    if isinstance(value, str):
        return draw(st.one_of(st.sampled_from(FLEET_WORDS), st.sampled_from(
            [value.upper(), value.lower(), f"{value}x", value[:-1], f" {value}", f"{value}\x00", [value],
             value * 3])))
    if isinstance(value, list) and value:
        i = draw(st.integers(0, len(value) - 1))
        return draw(st.sampled_from([[*value, value[i]], value[:i] + value[i + 1:], [], value[::-1],
                                     [copy.deepcopy(value[i])] + value]))
    if isinstance(value, dict) and value:
        key = draw(st.sampled_from(list(value)))
        other = {k: v for k, v in value.items() if k != key}
        return draw(st.sampled_from([{**other, str(key).upper(): value[key]}, other,
                                     {**other, draw(fleet_keys): value[key]}, {}]))
    return draw(fleet_values)


@st.composite
def _mutated_fleet(draw: st.DrawFn) -> Any:
    """A valid fleet file with a few random edits deep in it: a value changed to one of its kind or
    replaced by anything, a key or item deleted or added, a value wrapped in a list, two swapped."""
    doc = copy.deepcopy(draw(st.sampled_from(FLEET_BASES)))
    for _ in range(draw(st.integers(1, 3))):
        node: Any = doc
        while True:  # walk down to a random container, mostly deep
            slots = list(node) if isinstance(node, dict) else list(range(len(node)))
            if not slots:
                break
            slot = draw(st.sampled_from(slots))
            child = node[slot]
            if not (isinstance(child, dict | list) and child) or draw(st.integers(0, 3)) == 0:
                break
            node = child
        action = draw(st.sampled_from(["tweak"] * 3 + ["replace", "delete", "add", "wrap", "swap"]))
        if not slots or action == "add":
            if isinstance(node, dict):
                node[draw(fleet_keys)] = draw(fleet_values)
            else:
                node.insert(draw(st.integers(0, len(node))), draw(fleet_values))
        elif action == "tweak":
            node[slot] = _tweak(draw, node[slot])
        elif action == "replace":
            node[slot] = draw(fleet_values)
        elif action == "delete":
            del node[slot]
        elif action == "wrap":
            node[slot] = [node[slot]]
        else:
            other = draw(st.sampled_from(slots))
            node[slot], node[other] = node[other], node[slot]
    return doc


YAML_SNIPPETS = ("\n", ": ", "- ", "{", "}", "[", "]", ",", "'", '"', "#", "&a ", "*a", "*b", "<<: *a\n",
                 "? ", "!!binary ", "!!python/object:os.system ", "!!set ", "!!int ", "2020-13-45",
                 "2024-02-30 25:61", "1e400", ".inf", ".nan", "0x1F", "0o17", "1_000", "9" * 60, "~", "null",
                 "yes", "\t", "%YAML 1.1\n", "---\n", "...\n", "\\x00", "\x00", "\ufeff", "\x85", "\u2028")


@st.composite
def _spliced_fleet_text(draw: st.DrawFn) -> str:
    """A valid fleet file as YAML text with a few cuts and insertions (YAML syntax, tags, anchors,
    timestamps, control characters)."""
    text = yaml.safe_dump(draw(st.sampled_from(FLEET_BASES)), sort_keys=False,
                          default_flow_style=draw(st.sampled_from([False, None, True])))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 12))
        new = draw(st.one_of(st.sampled_from(YAML_SNIPPETS), st.text(max_size=8)))
        text = text[:at] + new + text[at + cut:]
    return text


fleet_inputs = st.one_of(  # mostly edited valid files: most raw input stops at the first check
    _mutated_fleet().map(lambda d: ("yaml", d)),
    _mutated_fleet().map(lambda d: ("yaml", d)),
    _mutated_fleet().map(lambda d: ("yaml", d)),
    _spliced_fleet_text().map(lambda t: ("text", t)),
    st.sampled_from(FLEET_BASES).map(lambda d: ("yaml", d)),
    fleet_values.map(lambda d: ("yaml", d)),
    st.binary(max_size=300).map(lambda b: ("raw", b)),
    st.text(max_size=300).map(lambda t: ("text", t)))

REQUEST_LOG = "timestamp,model,input_tokens,output_tokens\n" + "".join(
    f"{1_700_000_000 + 37 * i},{('phi-4', 'acme-8b')[i % 2]},{100 + i},{20 + i % 7}\n" for i in range(400))
ONE_MODEL_LOG = "\n".join(line for line in REQUEST_LOG.splitlines() if ",phi-4," not in line) + "\n"


class FleetTarget:
    """Writes the input as ``fleet.yaml`` next to a request log and pool traces (valid and not), and
    loads it with :func:`load_fleet`; a fleet that loads and whose workloads are all of
    ``activate_kinds`` (cheap to read: ``csv`` by default) is also activated (workloads read and
    scaled, models, offers and the scenario registered; no template library is built), and the
    process's fleet registrations are put back afterwards. A project error from the loader must
    name the file."""

    def __init__(self, activate_kinds: tuple[str, ...] = ("csv",)) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self.root = Path(self._dir.name)
        self.activate_kinds = activate_kinds
        self.loaded = self.activated = 0
        (self.root / "pools").mkdir()
        (self.root / "pools" / "l40s.csv").write_text("time_s,nodes\n0,20\n345600,3\n")
        (self.root / "rack.csv").write_text("time_s,nodes\n0,2\n")
        (self.root / "bad.csv").write_text("time_s,nodes\n0,1e400\n")
        (self.root / "binary.csv").write_bytes(b"\xff\xfe\x00time_s")
        (self.root / "requests.csv").write_text(REQUEST_LOG)
        (self.root / "acme.csv").write_text(ONE_MODEL_LOG)
        self.path = self.root / "fleet.yaml"

    def __call__(self, item: tuple[str, Any]) -> None:
        kind, data = item
        if kind == "yaml":
            try:
                text = yaml.safe_dump(data, sort_keys=False)
            except (yaml.YAMLError, ValueError, TypeError, RecursionError):
                return  # not representable: nothing to load
            self.path.write_text(text)
        elif kind == "raw":
            self.path.write_bytes(data)
        else:
            self.path.write_text(data, encoding="utf-8", errors="surrogatepass")
        try:
            spec = load_fleet(self.path)
        except FleetFileError as exc:
            assert str(self.path) in str(exc), f"the error does not name the file: {exc}"
            raise
        self.loaded += 1
        assert spec.models and len(spec.workloads) == len(spec.models) and spec.offers
        if all(w.source.partition(":")[0] in self.activate_kinds for w in spec.workloads):
            self._activate()

    def _activate(self) -> None:
        active = read_fleet(self.path)
        self.activated += 1
        assert [s.name for s in active.series] == list(active.spec.model_names)
