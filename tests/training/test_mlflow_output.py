"""atoll.training.mlflow_output: SB3 logger key/values reach an MLflow run as metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
import torch
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import _validate_metric_name
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Figure, HumanOutputFormat, Image

from atoll.training.mlflow_output import FORMAT_NAME, MLflowOutputFormat, make_logger, sanitize_metric_key


def _history(run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in mlflow.MlflowClient().get_metric_history(run_id, key)]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("rollout/ep_rew_mean", "rollout/ep_rew_mean"),
        ("train/clip_range", "train/clip_range"),
        ("time:elapsed (s)", "time_elapsed _s_"),
        ("a//b/", "a/b"),
        ("/a/./b", "a/b"),
        ("../up", "__/up"),
        ("..hidden/x", "__hidden_x"),
        ("", "_"),
    ],
)
def test_sanitize_metric_key(key: str, expected: str) -> None:
    assert sanitize_metric_key(key) == expected
    _validate_metric_name(expected)  # MLflow's own check: raises if it would reject the name


def test_sanitize_metric_key_truncates_to_mlflow_limit() -> None:
    name = sanitize_metric_key("x/" * 200)
    assert len(name) <= 250
    _validate_metric_name(name)


def test_write_logs_scalars_skips_excluded_and_non_scalars(mlflow_run_id: str) -> None:
    output = MLflowOutputFormat(mlflow_run_id)
    key_values: dict[str, Any] = {
        "train/loss": 0.25,
        "train/n_updates": 7,
        "train/std": np.float32(0.5),
        "train/zero_d": np.array(3.0),
        "train/tensor": torch.tensor(2.0),
        "train/flag": True,
        "train/diverged": float("nan"),
        "time:fps": 120,
        "secret/only_tensorboard": 1.0,
        "secret/not_mlflow": 2.0,
        "text/name": "ppo",
        "hist/actions": np.arange(4.0),
        "media/image": Image(np.zeros((3, 2, 2)), "CHW"),
        "media/figure": Figure(object(), close=False),  # type: ignore[arg-type]
    }
    key_excluded: dict[str, tuple[str, ...]] = {key: ("",) for key in key_values}
    key_excluded["secret/only_tensorboard"] = ("stdout", "log", "json", "csv")
    key_excluded["secret/not_mlflow"] = ("tensorboard", FORMAT_NAME)
    output.write(key_values, key_excluded, step=128)

    metrics = mlflow.MlflowClient().get_run(mlflow_run_id).data.metrics
    assert set(metrics) == {
        "train/loss",
        "train/n_updates",
        "train/std",
        "train/zero_d",
        "train/tensor",
        "train/flag",
        "train/diverged",
        "time_fps",
        "secret/only_tensorboard",
    }
    assert _history(mlflow_run_id, "train/loss") == [(128, 0.25)]
    assert metrics["train/std"] == 0.5 and metrics["train/flag"] == 1.0 and metrics["time_fps"] == 120
    assert math.isnan(metrics["train/diverged"])

    output.close()
    with pytest.raises(RuntimeError, match="after close"):
        output.write({"train/loss": 1.0}, {"train/loss": ("",)}, step=1)


def test_unknown_run_fails_at_construction() -> None:
    with pytest.raises(MlflowException):
        MLflowOutputFormat("0" * 32)


class _RecordExtras(BaseCallback):
    """Records one key MLflow must receive and one it must not, as a training loop would."""

    def _on_step(self) -> bool:
        self.logger.record("custom/kept", 1.5)
        self.logger.record("custom/not_in_mlflow", 2.5, exclude=FORMAT_NAME)
        return True


def test_ppo_training_metrics_reach_the_run(mlflow_run_id: str, new_ppo: Any, tmp_path: Path) -> None:
    model, venv = new_ppo(seed=0)
    model.set_logger(make_logger(mlflow_run_id, folder=str(tmp_path / "sb3"), extra_formats=("csv",)))
    model.learn(total_timesteps=256, callback=_RecordExtras())

    metrics = mlflow.MlflowClient().get_run(mlflow_run_id).data.metrics
    # SB3 dumps once per rollout (n_steps=64) at step = num_timesteps.
    assert [step for step, _ in _history(mlflow_run_id, "time/total_timesteps")] == [64, 128, 192, 256]
    assert [value for _, value in _history(mlflow_run_id, "time/total_timesteps")] == [64, 128, 192, 256]
    assert {"rollout/ep_rew_mean", "rollout/ep_len_mean", "train/loss", "train/approx_kl"} <= set(metrics)
    assert metrics["rollout/ep_len_mean"] == 16
    assert "custom/kept" in metrics and "custom/not_in_mlflow" not in metrics
    # The SB3 csv output still gets everything, the excluded key included.
    header = (tmp_path / "sb3" / "progress.csv").read_text().splitlines()[0].split(",")
    assert "custom/not_in_mlflow" in header and "rollout/ep_rew_mean" in header


def test_make_logger_formats(mlflow_run_id: str) -> None:
    logger = make_logger(mlflow_run_id)  # default: stdout + mlflow, no folder needed
    assert [type(f) for f in logger.output_formats] == [HumanOutputFormat, MLflowOutputFormat]
    assert [type(f) for f in make_logger(mlflow_run_id, extra_formats=()).output_formats] == [
        MLflowOutputFormat
    ]
    assert len(make_logger(mlflow_run_id, extra_formats="stdout").output_formats) == 2
    with pytest.raises(ValueError, match="folder"):
        make_logger(mlflow_run_id, extra_formats=("csv",))
    with pytest.raises(ValueError, match="always included"):
        make_logger(mlflow_run_id, extra_formats=("stdout", "mlflow"))
    with pytest.raises(ValueError, match="unknown SB3 output format 'wandb'"):
        make_logger(mlflow_run_id, folder="/tmp", extra_formats=("wandb",))
