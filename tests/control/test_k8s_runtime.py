"""The rendered runtime against the pinned vLLM: every ``vllm serve`` flag and environment
variable atoll renders is in the table read from vLLM 0.33.0's source
(:mod:`atoll.control.k8s.vllm`), the KV roles are the ones that release asks for, and the
image is configurable (option, fleet file, ``--image``)."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from atoll.control.k8s.render import K8sOptions, k8s_options, render_manifests
from atoll.control.k8s.vllm import (
    KV_ROLES,
    OTHER_ENV,
    VLLM_ENV,
    VLLM_IMAGE,
    VLLM_SERVE_FLAGS,
    VLLM_VERSION,
    known_env,
    unknown_serve_args,
)
from atoll.control.plans import PlanRecord, SinkError
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

PIPE_DECODE = Template(Service("Llama-3-70B", Phase.DECODE), "aws:us-east-2", (("4xL4", 1), ("4xL40S", 2)),
                       (Stage(16, ("4xL4",)), Stage(32, ("4xL40S",)), Stage(32, ("4xL40S",))), 900.0)
PIPE_PREFILL = Template(Service("Llama-3-70B", Phase.PREFILL), "aws:us-east-2", (("4xL40S", 2),),
                        (Stage(40, ("4xL40S",)), Stage(40, ("4xL40S",))), 9000.0)
SINGLE_PREFILL = Template(Service("Phi-4-14B", Phase.PREFILL), "aws:us-east-2", (("1xH100", 1),),
                          (Stage(40, ("1xH100",)),), 5000.0)
SINGLE_DECODE = Template(Service("Phi-4-14B", Phase.DECODE), "aws:us-east-2", (("2/8xH100", 1),),
                         (Stage(40, ("2/8xH100",)),), 900.0)
ALL = (PIPE_DECODE, PIPE_PREFILL, SINGLE_PREFILL, SINGLE_DECODE)


def plan(templates: tuple[Template, ...]) -> PlanRecord:
    return PlanRecord.from_allocation(1, 0.0, Allocation.of({t.key: 1 for t in templates}), None,
                                      {t.key: t for t in templates}, {}, "test")


def containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The vLLM containers (of the workloads of planned templates; not the router's)."""
    out = []
    for d in docs:
        if "atoll.io/template-key" not in d["metadata"].get("annotations", {}):
            continue
        spec = d.get("spec", {})
        pods = [spec["template"]["spec"]] if d["kind"] == "Deployment" else []
        if d["kind"] == "LeaderWorkerSet":
            lwt = spec["leaderWorkerTemplate"]
            pods = [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]
        for p in pods:
            out.extend(p["containers"])
    return out


def serve_args(container: dict[str, Any]) -> list[str] | None:
    """The ``vllm serve`` argv inside a container's ``sh -c`` script, or None."""
    script = container["command"][-1]
    if "vllm serve" not in script:
        return None
    return shlex.split(script[script.index("vllm serve"):])


@pytest.mark.parametrize("pd", ["disaggregated", "aggregated"])
def test_every_rendered_flag_and_variable_is_in_the_pinned_versions_table(pd: str) -> None:
    docs = render_manifests(plan(ALL), K8sOptions(pd=pd))
    seen_flags: set[str] = set()
    served = 0
    for c in containers(docs):
        assert c["image"] == VLLM_IMAGE == f"vllm/vllm-openai:v{VLLM_VERSION}"
        for e in c.get("env", []):
            assert known_env(e["name"]), e["name"]
        args = serve_args(c)
        if args is None:
            continue
        served += 1
        flags = [a for a in args[3:] if a.startswith("--")]
        assert flags and all(f in VLLM_SERVE_FLAGS for f in flags), flags
        seen_flags.update(flags)
        assert unknown_serve_args(shlex.join(args)) == []
    assert served == 4  # two Deployments, two LeaderWorkerSet leaders
    if pd == "disaggregated":
        assert "--kv-transfer-config" in seen_flags
        assert {e["name"] for c in containers(docs) for e in c["env"]} >= {
            "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"}
    assert "--pipeline-parallel-size" in seen_flags and "VLLM_PP_LAYER_PARTITION" in VLLM_ENV
    assert set(OTHER_ENV) >= {"HF_TOKEN"}


def test_kv_roles_follow_the_phase_as_the_pinned_version_asks() -> None:
    docs = render_manifests(plan(ALL))
    roles: dict[tuple[str, int], str] = {}
    for d in docs:
        if "atoll.io/template-key" not in d["metadata"].get("annotations", {}):
            continue
        phase = d["metadata"]["labels"]["atoll.io/phase"]
        stages = d["spec"]["leaderWorkerTemplate"]["size"] if d["kind"] == "LeaderWorkerSet" else 1
        (c,) = [c for c in containers([d]) if serve_args(c)]
        args = serve_args(c)
        assert args is not None
        config = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == "NixlConnector"
        roles[(phase, stages)] = config["kv_role"]
        if config["kv_role"] == "kv_both":
            assert "kv_consumer" in d["metadata"]["annotations"]["atoll.io/vllm-caveat"]
    # prefill produces, a single-node decode consumes, a pipelined decode keeps kv_both (0.33.0
    # refuses kv_consumer with pipeline parallelism)
    assert roles == {("prefill", 2): "kv_producer", ("prefill", 1): "kv_producer",
                     ("decode", 1): "kv_consumer", ("decode", 3): "kv_both"}
    assert set(roles.values()) <= set(KV_ROLES)


def test_the_table_catches_what_the_pinned_version_would_refuse() -> None:
    ok = "vllm serve org/m --served-model-name m --tensor-parallel-size 2 --distributed-executor-backend ray"
    assert unknown_serve_args(ok) == []
    assert "not an option" in unknown_serve_args("vllm serve org/m --enable-magic 1")[0]
    assert "accepts ray, mp" in unknown_serve_args("vllm serve org/m --distributed-executor-backend slurm")[0]
    bad_kv = unknown_serve_args(shlex.join(["vllm", "serve", "org/m", "--kv-transfer-config",
                                            '{"kv_connector":"Nixl","kv_role":"x"}']))
    assert len(bad_kv) == 2 and "kv_connector 'Nixl'" in bad_kv[0]
    assert "not 'vllm serve" in unknown_serve_args("python -m vllm.entrypoints.openai.api_server")[0]
    assert not known_env("VLLM_MADE_UP")


def test_the_image_is_configurable_and_validated() -> None:
    own = k8s_options({"image": "registry.local/vllm:0.33.0-cu13"})
    docs = render_manifests(plan((SINGLE_PREFILL,)), own)
    assert {c["image"] for c in containers(docs)} == {"registry.local/vllm:0.33.0-cu13"}
    with pytest.raises(SinkError, match="kubernetes: K8sOptions: field 'image'"):
        k8s_options({"image": "  "})
    assert K8sOptions().image == VLLM_IMAGE


def test_control_cli_image_flag_overrides_the_fleet_file(tmp_path: Any) -> None:
    from atoll.control.cli import build_parser
    from atoll.control.cli.control import _k8s_options

    args = build_parser().parse_args(["control", "--scrape", "http://x", "--state", str(tmp_path),
                                      "--sink", f"k8s:{tmp_path / 'k'}", "--image", "example/vllm:1",
                                      "--pd", "aggregated"])
    options = _k8s_options(args)
    assert options.image == "example/vllm:1" and options.pd == "aggregated"
