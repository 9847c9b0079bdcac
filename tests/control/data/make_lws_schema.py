"""Derive tests/control/data/lws-v1.schema.json from LeaderWorkerSet's published CRD.

Source: kubernetes-sigs/lws (Apache-2.0), config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml
(commit recorded in the output's "$comment"). The derived schema is the CRD's v1 openAPIV3Schema
with descriptions and ``status`` dropped and the two embedded pod templates replaced by a
reference to the core PodTemplateSpec, which the tests validate with kubernetes-validate
instead (so the file stays small).

    python tests/control/data/make_lws_schema.py CRD.yaml COMMIT > tests/control/data/lws-v1.schema.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml


def strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main() -> None:
    crd = yaml.safe_load(open(sys.argv[1]))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    schema["properties"].pop("status", None)
    lwt = schema["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
    for name in ("leaderTemplate", "workerTemplate"):
        lwt[name] = {"type": "object", "x-atoll-validate-as": "io.k8s.api.core.v1.PodTemplateSpec"}
    out = strip(schema)
    out["$comment"] = (f"Derived from kubernetes-sigs/lws (Apache-2.0) "
                       f"config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml at {sys.argv[2]}: "
                       f"the v1 openAPIV3Schema without descriptions and status; pod templates are "
                       f"validated as core PodTemplateSpecs. See make_lws_schema.py.")
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
