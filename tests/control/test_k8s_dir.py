"""``k8s:DIR`` is a real folder that ``kubectl apply -f DIR`` and ``-k DIR`` read: after any
number of deliveries it holds exactly the current plan's objects and kustomization, nothing
staged and nothing stale; the symbolic link an older layout kept there becomes a real folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_k8s_manifests import PIPE, SINGLE, plan

from atoll.control.k8s.render import render_manifests
from atoll.control.sinks import K8sManifestSink
from atoll.solvers.types import Phase, Service, Stage, Template

DECODE = Template(Service("Phi-4-14B", Phase.DECODE), "gcp:us-central1", (("1xH100", 1),),
                  (Stage(40, ("1xH100",)),), 900.0)
PLANS = ({PIPE: 1, SINGLE: 1}, {SINGLE: 2}, {SINGLE: 2, DECODE: 1}, {DECODE: 3}, {PIPE: 2, DECODE: 1})
KUBECTL = shutil.which("kubectl")


def _expected(record_plan: dict[Template, int], seq: int) -> set[str]:
    docs = render_manifests(plan(record_plan, seq=seq))
    return {f"{d['metadata']['name']}.{d['kind'].lower()}.yaml" for d in docs} | {"kustomization.yaml"}


def test_the_folder_stays_real_and_holds_exactly_the_current_plan(tmp_path: Path) -> None:
    d = tmp_path / "k8s"
    sink = K8sManifestSink(d)
    for seq, p in enumerate(PLANS, start=1):
        result = sink.write(plan(p, seq=seq))
        assert d.is_dir() and not d.is_symlink()
        names = {f.name for f in d.iterdir()}
        assert names == _expected(p, seq), seq
        kustomization = yaml.safe_load((d / "kustomization.yaml").read_text())
        assert set(kustomization["resources"]) == names - {"kustomization.yaml"}
        assert all(not Path(r).exists() for r in result.removed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k8s"]  # no versions or staging beside it


def test_an_unchanged_object_keeps_its_file(tmp_path: Path) -> None:
    d = tmp_path / "k8s"
    sink = K8sManifestSink(d)
    sink.write(plan({SINGLE: 2, DECODE: 1}, seq=1))
    inodes = {f.name: f.stat().st_ino for f in d.iterdir()}
    sink.write(plan({SINGLE: 3, DECODE: 1}, seq=2))  # only the prefill workload changes
    now = {f.name: f.stat().st_ino for f in d.iterdir()}
    same = {n for n in now if now[n] == inodes.get(n)}
    assert any(n.endswith(".service.yaml") for n in same)  # Services did not change: not rewritten
    assert any(n.endswith(".deployment.yaml") for n in set(now) - same)


def test_an_older_layouts_link_becomes_a_real_folder(tmp_path: Path) -> None:
    d = tmp_path / "k8s"
    sink = K8sManifestSink(d)
    sink.write(plan({SINGLE: 1}, seq=1))
    version = tmp_path / ".k8s.atoll.000001.abcd1234"  # what an older atoll kept beside DIR
    shutil.move(d, version)
    os.symlink(version.name, d)
    sink.write(plan({DECODE: 1}, seq=2))
    assert d.is_dir() and not d.is_symlink()
    assert {f.name for f in d.iterdir()} == _expected({DECODE: 1}, 2)
    assert not version.exists()


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_reads_every_file_of_the_folder(tmp_path: Path) -> None:
    """``kubectl apply -f DIR`` reads the folder (a symbolic link made it fail before reading any
    file: "read dir: is a directory"); with no cluster here it stops at the API server, after
    naming every object's file. ``kubectl kustomize DIR`` (what ``apply -k`` builds) needs no
    cluster: it yields exactly the plan's objects."""
    d = tmp_path / "k8s"
    sink = K8sManifestSink(d)
    for seq, p in enumerate(PLANS[:3], start=1):
        sink.write(plan(p, seq=seq))
    config = tmp_path / "kubeconfig"  # a cluster on a closed port: nothing leaves this host
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u"}]}))
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp_path)}
    proc = subprocess.run([str(KUBECTL), "apply", "-f", str(d), "--dry-run=client", "--validate=false"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert "is a directory" not in proc.stderr and "error parsing" not in proc.stderr, proc.stderr
    objects = {f.name for f in d.glob("atoll-*.yaml")}
    named = set(re.findall(r"(atoll-[^/\"\s]+\.yaml)", proc.stderr))
    assert named == objects, proc.stderr[-2000:]
    built = subprocess.run([str(KUBECTL), "kustomize", str(d)], capture_output=True, text=True, env=env,
                           timeout=120)
    assert built.returncode == 0, built.stderr
    docs = list(yaml.safe_load_all(built.stdout))
    assert sorted(f"{o['metadata']['name']}.{o['kind'].lower()}.yaml" for o in docs) == sorted(objects)
