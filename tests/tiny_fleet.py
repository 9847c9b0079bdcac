"""A small two-model fleet the env and contest tests share: single-node templates of Phi-4-14B
and GPT-OSS-20B on three configs in both core regions, with hand-set throughputs."""

from __future__ import annotations

from atoll.solvers.types import Phase, Service, Stage, Template

MODELS = ("Phi-4-14B", "GPT-OSS-20B")
REGIONS = ("aws:us-east-2", "aws:ap-northeast-2")
# (config, prefill tokens/s, decode tokens/s) of one instance
CONFIGS = (("1xL4", 700.0, 15.0), ("1xL40S", 1500.0, 40.0), ("4xA10G", 2500.0, 60.0))
LAYERS = {"Phi-4-14B": 40, "GPT-OSS-20B": 24}


def two_model_templates() -> tuple[Template, ...]:
    """One whole-node template per (model, region, config, phase)."""
    return tuple(Template(Service(model, phase), region, ((cfg, 1),), (Stage(LAYERS[model], (cfg,)),), thr)
                 for model in MODELS for region in REGIONS for cfg, thr_p, thr_d in CONFIGS
                 for phase, thr in ((Phase.PREFILL, thr_p), (Phase.DECODE, thr_d)))
