"""Objects checked as the API server of a named Kubernetes version would check them, before a
sink writes or applies any (``kube_version``, ``atoll control --kube-version 1.33``).

- Core kinds (Deployment, Service, ConfigMap, the LeaderWorkerSets' pod templates) against that
  version's OpenAPI schemas, strictly (an unknown field fails), with kubernetes-validate (it
  ships the schemas of Kubernetes 1.25 to 1.37: :func:`kube_versions`).
- KEDA ScaledObjects (the metrics sink's examples) against KEDA v2.20.2's CRD, likewise.
- LeaderWorkerSets against the structural schema of the LWS CRD (``leaderworkerset.x-k8s.io/v1``,
  ``data/lws-v1.schema.json``: the CRD's openAPIV3Schema from kubernetes-sigs/lws, Apache-2.0, at
  commit 060ab4da17eea1f0865fcbd3236bb1075e2cea32, descriptions and status dropped): types, enums
  and required fields as jsonschema, and the fields the API server would *prune* (a structural
  schema drops fields it does not declare instead of refusing them, so a misspelt field would
  vanish silently): those are errors here.

What this is not: a server-side dry run. No Kubernetes API server binary installs from PyPI,
Debian or npm (Debian ships only the client, ``kubernetes-client``), so admission, defaulting
and immutable-field checks of a live server are left to ``k8s-apply`` without ``--apply`` (a
server-side dry run against the user's cluster).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from atoll.control.plans import SinkError

LWS_SCHEMA_PATH = Path(__file__).parent.parent / "data" / "lws-v1.schema.json"
# KEDA's ScaledObject CRD (kedacore/keda v2.20.2, Apache-2.0; see the file's $comment): the
# example ScaledObjects the metrics sink serves are checked against it
KEDA_SCHEMA_PATH = Path(__file__).parent.parent / "data" / "keda-scaledobject-v1alpha1.schema.json"
CRD_SCHEMAS = {"LeaderWorkerSet": LWS_SCHEMA_PATH, "ScaledObject": KEDA_SCHEMA_PATH}


@cache
def kube_versions() -> tuple[str, ...]:
    """The Kubernetes versions whose schemas kubernetes-validate ships ("1.25.0", ...)."""
    from kubernetes_validate.utils import all_versions  # imported only when validation is asked for

    return tuple(dict.fromkeys(all_versions()))  # it lists each version once per strictness


def kube_version(text: str, where: str = "kube_version") -> str:
    """``1.33``, ``v1.33`` or ``1.33.0`` -> the schema version kubernetes-validate holds for it."""
    m = re.fullmatch(r"v?(1)\.([0-9]{1,2})(?:\.[0-9]+)?", str(text).strip())
    want = f"{m.group(1)}.{m.group(2)}.0" if m else None
    if want not in kube_versions():
        raise SinkError(f"{where}: Kubernetes {text!r} has no schema here; give one of "
                        f"{', '.join(v.rsplit('.', 1)[0] for v in kube_versions())}")
    assert want is not None
    return want


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(CRD_SCHEMAS[kind].read_text(encoding="utf-8"))
    return doc


def lws_schema() -> dict[str, Any]:
    return crd_schema("LeaderWorkerSet")


def pruned_fields(node: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``node`` that a structural schema does not declare (the API server prunes
    them), as dotted paths."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or "x-atoll-validate-as" in schema:
        return []
    out: list[str] = []
    if isinstance(node, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for k, v in node.items():
            here = f"{path}.{k}" if path else k
            if props is not None and k in props:
                out += pruned_fields(v, props[k], here)
            elif isinstance(extra, dict):
                out += pruned_fields(v, extra, here)
            elif props is not None and extra is not True:
                out.append(here)
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(node):
            out += pruned_fields(v, schema["items"], f"{path}[{i}]")
    return out


def api_problems(doc: dict[str, Any], version: str) -> list[str]:
    """What the API server of Kubernetes ``version`` (a :func:`kube_version`) would refuse or
    prune in ``doc``; empty when it would take it."""
    import jsonschema
    import kubernetes_validate

    def core(obj: dict[str, Any], what: str) -> list[str]:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return [f"{what}: {exc.message} at {'.'.join(str(p) for p in exc.path) or '(top)'}"]
        except kubernetes_validate.SchemaNotFoundError as exc:
            return [f"{what}: no schema for it in Kubernetes {version} ({exc})"]
        return []

    kind = str(doc.get("kind"))
    if kind not in CRD_SCHEMAS:
        return core(doc, f"{kind} (Kubernetes {version})")
    schema = crd_schema(kind)
    out = [f"{kind} CRD schema: {e.message} at {'.'.join(str(p) for p in e.path) or '(top)'}"
           for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    out += [f"{kind} CRD schema: field {p} is not in the schema (the API server would prune it)"
            for p in pruned_fields(doc, schema)]
    lwt = doc.get("spec", {}).get("leaderWorkerTemplate", {})
    for role in ("leaderTemplate", "workerTemplate"):
        if role in lwt:
            out += core({"apiVersion": "v1", "kind": "PodTemplate",
                         "metadata": {"name": f"{doc['metadata']['name'][:40]}-{role.lower()}"},
                         "template": lwt[role]},
                        f"LeaderWorkerSet {role} as a PodTemplateSpec (Kubernetes {version})")
    return out


def check_api(doc: dict[str, Any], version: str, where: str) -> None:
    """SinkError naming ``where`` and every problem :func:`api_problems` finds."""
    problems = api_problems(doc, version)
    if problems:
        raise SinkError(f"{where}: {'; '.join(problems)}")
