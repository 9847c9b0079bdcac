"""Manifests are plain YAML: an object the renderer shares between two places (a label map used
by a selector and a template) is written twice, never as an anchor and an alias."""

from __future__ import annotations

import yaml

from atoll.control.k8s.apply import dump_yaml, dump_yaml_all


def test_shared_objects_are_written_out_not_aliased() -> None:
    labels = {"app.kubernetes.io/name": "phi", "atoll.dev/phase": "decode"}
    doc = {"kind": "Deployment", "spec": {"selector": {"matchLabels": labels},
                                         "template": {"metadata": {"labels": labels}}}}
    assert "&id" in yaml.safe_dump(doc)  # the control: PyYAML's default aliases shared objects
    text = dump_yaml(doc)
    assert "&" not in text and "*id" not in text
    assert yaml.safe_load(text) == doc
    assert list(yaml.safe_load(text)) == ["kind", "spec"]  # keys in their given order
    both = dump_yaml_all([doc, doc])
    assert "&" not in both and list(yaml.safe_load_all(both)) == [doc, doc]
