"""Where outputs go: directory names of the shared downloads (models, datasets, kernels) under results/.

A model or dataset directory is named after what it holds (the repository at its pinned revision, or
the settings that generate it), so runs that share an input share its download.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from videogrpo.config import Config, canonical_json, select, task_names
from videogrpo.config.identity import download_fields


def _slug(repo_id: str) -> str:
    return repo_id.replace("/", "--")


def _short_digest(obj: Any, length: int = 12) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def model_key(cfg: Config) -> str:
    """Directory name of the base model: the repo at its revision, or the tiny builder's settings."""
    m = cfg.model
    if m.source == "tiny":
        return f"tiny-{_short_digest(select(cfg, download_fields(cfg, 'model')))}"
    return f"{_slug(m.repo_id)}@{m.revision[:12]}"


def refiner_download(expert) -> dict[str, Any]:
    """What a prompt refiner's download is (a refiners.experts record): the repo at its revision, or the tiny
    builder's seed; two refiners of one download share it."""
    if expert.source == "tiny":
        return {"source": "tiny", "tiny_seed": expert.tiny_seed, "vision": expert.vision}
    return {"source": "hub", "repo_id": expert.repo_id, "revision": expert.revision}


def refiner_key(expert) -> str:
    """Directory name of a prompt refiner's download under results/models/refiners/."""
    if expert.source == "tiny":
        return f"tiny-{_short_digest(refiner_download(expert))}"
    return f"{_slug(expert.repo_id)}@{expert.revision[:12]}"


def judge_key(cfg: Config) -> str:
    """Directory name of the VLM judge model: the repo at its revision."""
    return f"{_slug(cfg.reward.judge_model)}@{cfg.reward.judge_revision[:12]}"


def kernel_key(cfg: Config) -> str:
    """Directory name of the attention kernel's cache: the kernel repo at its revision."""
    return f"{_slug(cfg.parallel.attention_kernel_repo)}@{cfg.parallel.attention_kernel_revision[:12]}"


def data_key(cfg: Config, task_list_text: str) -> str:
    """Directory name of the dataset: the repo at its revision, or the synthetic generator's settings."""
    d = cfg.data
    if d.source == "synthetic":
        return f"synthetic-{_short_digest([select(cfg, download_fields(cfg, 'data')), task_names(task_list_text)])}"
    return f"{_slug(d.repo_id)}@{d.revision[:12]}"


def evalkit_key(cfg: Config) -> str:
    """Directory name of an EvalKit checkout's records: its pinned digest and a digest of the EasyOCR weights
    folder it names (the fingerprint records that folder's tree digest). Not where the checkout lives: it is pinned
    by its digest, so a moved copy is the same EvalKit and reruns nothing, and a missing or edited one is refused
    before any job (pipeline/start_check.py)."""
    return f"{cfg.evalkit.digest[:12] or 'none'}-{_short_digest(cfg.evalkit.easyocr_models, 8)}"


def evalset_key(cfg: Config, task_list_text: str) -> str:
    """Directory name of an evaluation set: its pinned tree digest, or, for one built from the dataset, its split
    and a digest of what chooses its samples (the dataset's contract fields, which fix its splits, and the
    evaluation set's own)."""
    from videogrpo.config.identity import eval_set_fields, identity_fields, stage_view

    if cfg.matrix.eval_set:
        return f"evalset-{cfg.matrix.eval_set_digest[:12]}"
    dataset = identity_fields(stage_view(cfg, "materialize_dataset"))
    chosen = select(cfg, eval_set_fields(cfg))
    return f"{cfg.matrix.split}-{_short_digest([dataset, task_names(task_list_text), chosen])}"


def matrix_key(cfg: Config, task_list_text: str) -> str:
    """Directory name of a matrix: its evaluation set and the settings every generated video depends on."""
    from videogrpo.config.identity import GENERATION_FIELDS, generation_fields

    settings = select(cfg, [*GENERATION_FIELDS, *generation_fields(cfg).values()])
    return f"{evalset_key(cfg, task_list_text)}-gen-{_short_digest(settings, 8)}"


def cell_models(cfg: Config, run_id: str) -> dict[str, str]:
    """The name of each model of the run's cells (matrix.models and the held-out check's) -> its directory in the
    matrix (the `model` wildcard): the base model's by what it is (shared by runs), the trained one's by its run (and
    its best point's, `best`, and its moving average, `ema`, beside it), a hub model's by its revision."""
    from videogrpo.config.cells import cell_model_names

    names = {}
    for name in cell_model_names(cfg):
        if name == "base":
            names[name] = f"base-{model_key(cfg)}"
        elif name == "trained":
            names[name] = run_id
        elif name in ("best", "ema", "refined", "base_refiners"):  # train's best/, ema/; the refiners' cells
            names[name] = f"{run_id}-{name}"
        else:
            names[name] = hub_model_key(name, cfg.matrix.hub_models[name])
    return names


def hub_model_key(name: str, spec: str) -> str:
    """Directory name of a hub model to evaluate: its matrix name and revision."""
    return f"{name}@{spec.partition('@')[2][:12]}"


def results_problem(results: str | Path, writing: bool = True) -> str | None:
    """Why outputs cannot be written under `results`, found without writing (a dry run writes nothing): the nearest
    existing folder on its path is no directory, or (`writing`: for a run, not a dry run, which only reads) is not
    writable; None when it can be made."""
    path = Path(results)
    existing = next((p for p in [path, *path.parents] if p.exists() or p.is_symlink()), Path("."))
    reason = None
    if not existing.is_dir():
        reason = f"{existing} is no directory"
    elif writing and not os.access(existing, os.W_OK | os.X_OK):
        reason = f"{existing} is not writable"
    if reason is None:
        return None
    return (
        f"results = {str(results)!r}: cannot write {path} ({reason}); point `results` at a writable directory, "
        f"e.g. --config results=/scratch/$USER/videogrpo-results"
    )
