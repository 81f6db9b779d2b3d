"""The rows of a run's metrics.jsonl: one per optimizer update (the training keys: reward_mean, policy_loss, ...),
and, with validation during training on (train.validate_every, validate_before_training), one per validation point,
whose keys other than `step` all start with `val/`. Whatever reads the file picks the rows it means here."""

from __future__ import annotations

VALIDATION_PREFIX = "val/"


def is_validation(row: dict) -> bool:
    return any(key.startswith(VALIDATION_PREFIX) for key in row)


def training_rows(rows: list[dict]) -> list[dict]:
    """The rows of optimizer updates, in file order."""
    return [row for row in rows if not is_validation(row)]


def validation_rows(rows: list[dict]) -> list[dict]:
    """The rows of validation points, in file order."""
    return [row for row in rows if is_validation(row)]


def gold_kinds(rows: list[dict]) -> list[str]:
    """The gold rewards (train.validate_rewards) that scored these validation points: their `val/<kind>/...` keys."""
    return sorted(
        {key.split("/")[1] for row in rows for key in row if key.startswith(VALIDATION_PREFIX) and key.count("/") == 2}
    )
