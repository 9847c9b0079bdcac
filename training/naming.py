"""How a policy is named where people and MLflow read it: a run's short name, a policy's MLflow
parameters, and metric keys MLflow accepts."""

from __future__ import annotations

from pathlib import Path

from atoll.envs.vocabulary import format_level, parse_policy


def short_name(spec: str) -> str:
    """A run name a person reads: a learned policy's registered name and version (or alias), or
    the first 8 characters of its logged model or run id; a rule's own name."""
    parsed = parse_policy(spec)
    if not parsed.is_learned:
        return spec
    uri = parsed.uri
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


def policy_params(spec: str) -> dict[str, str]:
    """A policy's MLflow parameters: its text and kind, a learned policy's model URI, a rule's
    planning level (``env``: the environment's), interval and band."""
    parsed = parse_policy(spec)
    params = {"policy": spec, "policy.kind": parsed.kind}
    if parsed.is_learned:
        return {**params, "policy.model_uri": parsed.uri}
    if parsed.is_per_model:
        return params
    params["policy.planning_quantile"] = "env" if parsed.level is None else format_level(parsed.level)
    if parsed.every is not None and parsed.kind == "fixed":
        params["policy.every_steps"] = str(parsed.every)
    elif parsed.band is not None:
        params["policy.low"], params["policy.high"] = (f"{v:g}" for v in parsed.band)
    return params
