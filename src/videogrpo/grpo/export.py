"""The trained weights written out in Diffusers format: the final export (final/) and, with train.keep_best_by, the
weights of the validation point a gold reward scored best (best/ beside final/).

While training, the best point's weights are a snapshot beside the checkpoints (`best-<update>/`), written when a
point beats every earlier one. A snapshot stays while the current best or a kept checkpoint names it (a resume
restores that checkpoint's choice and needs its weights), and goes at the next checkpoint otherwise. At the end the
chosen snapshot becomes best/, with best.json saying how it was chosen.

May import: `models`, `provenance` and the core modules (the trainer hands itself in).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from videogrpo import atomic
from videogrpo.errors import VideoGRPOError
from videogrpo.models.i2v import EXPERT_FOLDERS
from videogrpo.parallel import process_groups

STATE = "training_state.json"
BEST = "best.json"


def write_weights(trainer, target: Path, state: dict) -> None:
    """The trained transformer(s) (`transformer`, and for I2V-A14B `transformer_2`; LoRA: the adapters, grpo/lora.py)
    into `target`, atomically, with `state` as training_state.json. Collective: every rank gathers its shards; rank
    0 writes."""
    from videogrpo.grpo import lora

    trained = lora.gather_export(trainer.experts, trainer.cfg) if lora.enabled(trainer.cfg) else None
    states = trainer.experts.full_state_dicts() if trained is None else {}
    if trainer.ctx.is_main:
        from diffusers import WanTransformer3DModel

        with atomic.atomic_directory(target) as tmp:
            for name, weights in states.items():
                plain = WanTransformer3DModel.from_config(trainer.model.trainable[name].config)
                plain.load_state_dict(weights)
                plain.save_pretrained(str(tmp / EXPERT_FOLDERS.get(name, name)))
            for name, (adapters, whole) in (trained or {}).items():
                folder = tmp / EXPERT_FOLDERS.get(name, name)
                lora.write_export(folder, trainer.model.trainable[name].config, adapters, whole, trainer.cfg)
            if trainer.refiners is not None:  # the prompt refiners and their rewrites beside the generator
                trainer.refiners.export(tmp, trainer.paths.checkpoints)
            (tmp / STATE).write_text(json.dumps(state, indent=2) + "\n")
    process_groups.barrier()


def snapshot(checkpoints: Path, update: int) -> Path:
    return checkpoints / f"best-{update:08d}"


def kept_snapshots(checkpoints: Path, current: int | None) -> set[int]:
    """The updates whose snapshots must stay: the current best's and each complete checkpoint's choice."""
    from videogrpo.grpo.checkpoint import complete_checkpoints, read_state

    kept = {current} if current is not None else set()
    for path in complete_checkpoints(checkpoints):
        best = (read_state(path).get("divergence_watch") or {}).get("best")
        if best:
            kept.add(best["update"])
    return kept


def prune_snapshots(checkpoints: Path, current: int | None) -> None:
    """Remove the snapshots nothing names any more (rank 0, after a checkpoint)."""
    keep = kept_snapshots(checkpoints, current)
    for path in sorted(checkpoints.glob("best-*")):
        if path.is_dir() and path.name[5:].isdigit() and int(path.name[5:]) not in keep:
            shutil.rmtree(path, ignore_errors=True)


def check_snapshot(checkpoints: Path, best: dict | None) -> None:
    """A resumed run's best point has its weights beside the checkpoints."""
    if best and not (snapshot(checkpoints, best["update"]) / STATE).is_file():
        raise VideoGRPOError(
            f"{snapshot(checkpoints, best['update'])}: the weights of update {best['update']}, the best validation "
            f"point so far by {best['reward']} (train.keep_best_by), which the checkpoint being resumed names, are "
            f"missing; restore them, or remove {checkpoints} to train the run again"
        )


def export_best(checkpoints: Path, target: Path, best: dict | None, reward: str, points: int) -> dict:
    """best/ from the chosen snapshot (rank 0), with best.json: the reward, the update, its score, how it was chosen
    and the weights' digest. Returns best.json's record."""
    from videogrpo.provenance.digest import tree_digest

    if best is None:
        raise VideoGRPOError(
            f"train.keep_best_by = {reward!r}: none of the {points} validation points has a score of {reward} (its "
            f"scorer failed at each; val/{reward}/failed in metrics.jsonl says why), so there is no best point to "
            f"export; fix the gold reward, or unset train.keep_best_by"
        )
    source = snapshot(checkpoints, best["update"])
    with atomic.atomic_directory(target) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        record = {
            **best,
            "chosen_by": f"the highest val/{reward}/reward_mean of the run's {points} validation points (the first of "
            "equals); train.keep_best_by",
            "weights_sha256": tree_digest(tmp),
        }
        (tmp / BEST).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
