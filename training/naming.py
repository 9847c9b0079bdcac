"""How a policy is named where people and MLflow read it: a run's short name, a policy's MLflow
parameters, and metric keys MLflow accepts."""

from __future__ import annotations

from pathlib import Path

from atoll.envs.vocabulary import PolicySpec, format_level


def short_name(spec: PolicySpec) -> str:
    """A run name a person reads: a learned policy's registered name and version (or alias), or
    the first 8 characters of its logged model or run id; a rule's own name (``str(spec)``)."""
    if not spec.is_learned:
        return str(spec)
    uri = spec.uri
    if uri.startswith("models:/"):
        rest = uri.removeprefix("models:/")
        if rest.startswith("m-"):
            return f"learned {rest[:10]}"
        return rest.strip("/")
    if uri.startswith("runs:/"):
        return f"learned run {uri.removeprefix('runs:/')[:8]}"
    return f"learned {Path(uri).name[:16]}"


def metric_key(text: str) -> str:
    """``text`` with the characters MLflow refuses in metric names replaced by ``_``."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in text)


def policy_params(spec: PolicySpec) -> dict[str, str]:
    """A policy's MLflow parameters: its text (``str(spec)``) and kind, a learned policy's model
    URI, a rule's planning level (``env``: the environment's), interval and band."""
    params = {"policy": str(spec), "policy.kind": spec.kind}
    if spec.is_learned:
        return {**params, "policy.model_uri": spec.uri}
    if spec.is_per_model:
        return params
    params["policy.planning_quantile"] = "env" if spec.level is None else format_level(spec.level)
    if spec.every is not None and spec.kind == "fixed":
        params["policy.every_steps"] = str(spec.every)
    elif spec.band is not None:
        params["policy.low"], params["policy.high"] = (f"{v:g}" for v in spec.band)
    return params
