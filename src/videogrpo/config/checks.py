"""Validation: every field rule (`fields`) and every cross-field rule, the reference's here and the options'
(`option_rules`), each naming the field, the value and the rule; the topology's rules (world size, waves, tensor
parallel)."""

from __future__ import annotations

import math
import re

from videogrpo.config.cells import RUN_MODELS, sampler_problem
from videogrpo.config.fields import (
    CHOICES,
    HEX40,
    HEX64,
    field_problems,
    revision_problem,
    reward_kinds,
)
from videogrpo.config.option_rules import (
    ema_problems,
    gold_overlap_problems,
    gold_problems,
    lora_problems,
    nft_problems,
    run_model_problems,
    sde_window_problems,
    update_problems,
    validation_problems,
)
from videogrpo.config.refiners_section import refined_model_problems, refiner_problems
from videogrpo.config.sections import SECTIONS, Config, LoggingConfig
from videogrpo.errors import ConfigError


def _model_problems(cfg: Config) -> list[str]:
    if cfg.model.source == "hub" and (why := revision_problem("model.revision", cfg.model.revision)):
        return [why]
    return []


def _experts_problems(cfg: Config) -> list[str]:
    """Choosing an expert means something only for a model that has two (docs/reference-system.md#a14b, Which train)."""
    if cfg.model.kind == "ti2v" and cfg.train.experts != "both":
        return [
            f"train.experts = {cfg.train.experts!r}: model.kind = 'ti2v' has one transformer, so only 'both' (train "
            f"it) applies; choose an expert with model.kind = 'i2v_a14b', or set train.experts: both"
        ]
    return []


def _data_problems(cfg: Config) -> list[str]:
    found = []
    if cfg.data.source == "hub" and (why := revision_problem("data.revision", cfg.data.revision)):
        found.append(why)
    if cfg.data.heldout_per_task >= cfg.data.samples_per_task:
        found.append(
            f"data.heldout_per_task = {cfg.data.heldout_per_task}: must be < data.samples_per_task "
            f"= {cfg.data.samples_per_task}, or nothing is left to train on"
        )
    return found


def _evalkit_problems(cfg: Config) -> list[str]:
    found = []
    if cfg.evalkit.path and not HEX64.match(cfg.evalkit.digest):
        found.append(f"evalkit.digest = {cfg.evalkit.digest!r}: must be the 64-hex source digest of {cfg.evalkit.path}")
    for i, pin in enumerate(cfg.evalkit.runtime):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", pin):
            found.append(f"evalkit.runtime[{i}] = {pin!r}: must be 'name==version'")
    return found


def _terms_problems(cfg: Config) -> list[str]:
    r, known = cfg.reward, CHOICES["reward.kind"]
    found = []
    for kind, weight in r.terms.items():
        if kind not in known:
            found.append(f"reward.terms.{kind}: unknown reward kind {kind!r}; the kinds are {', '.join(known)}")
        if not math.isfinite(weight) or weight == 0:
            found.append(
                f"reward.terms.{kind} = {weight!r}: a term's weight must be finite and non-zero (remove the term to "
                f"drop it)"
            )
    total = sum(r.terms.values())
    if (
        len(r.terms) > 1
        and all(map(math.isfinite, r.terms.values()))
        and abs(total) <= 1e-9 * max(map(abs, r.terms.values()))
    ):
        found.append(
            f"reward.terms = {dict(r.terms)}: the weights sum to 0, so a rollout that every reward scores alike gets "
            f"the same combined reward whether it scores 0 or 1 on them all, and the advantage sees only where the "
            f"rewards disagree; give the weights a non-zero sum (a negative weight is a penalty: e.g. 1.0 and -0.5)"
        )
    if r.terms and r.kind not in r.terms:
        found.append(
            f"reward.kind = {r.kind!r} is not among reward.terms ({', '.join(sorted(r.terms))}): with terms, "
            f"reward.kind must name one of them, so that it never names a reward the run does not score; set "
            f"reward.kind to one of the terms, or add {r.kind} to reward.terms"
        )
    return found


def _reward_problems(cfg: Config) -> list[str]:
    kinds = reward_kinds(cfg)
    if "vbvr_rule" in kinds and not cfg.evalkit.path:
        return ["evalkit.path = '': the vbvr_rule reward needs an EvalKit checkout directory"]
    found = []
    r = cfg.reward
    if "vbvr_vlm" in kinds:
        if why := revision_problem("reward.judge_revision", r.judge_revision):
            found.append(why)
        if not r.judge_prompts or not HEX64.match(r.judge_prompts_digest):
            found.append(
                f"reward.judge_prompts = {r.judge_prompts!r}, judge_prompts_digest = {r.judge_prompts_digest!r}: the "
                f"vbvr_vlm reward needs its rubric source (a module defining EVAL_PROMPTS) and its 64-hex SHA-256"
            )
        if not r.judge_protocol or not HEX64.match(r.judge_protocol_digest):
            found.append(
                f"reward.judge_protocol = {r.judge_protocol!r}, judge_protocol_digest = {r.judge_protocol_digest!r}: "
                f"the vbvr_vlm reward needs its protocol source (a module defining TASK_VLM_JUDGE_OUTPUT_REMINDER and "
                f"TASK_VLM_JUDGE_REPAIR_PROMPT) and its 64-hex SHA-256"
            )
        if not 0 < r.judge_gpu_memory <= 1:
            found.append(f"reward.judge_gpu_memory = {r.judge_gpu_memory}: must be in (0, 1]")
    return found


def _video_problems(cfg: Config) -> list[str]:
    found = []
    if cfg.video.num_frames % 4 != 1:
        found.append(f"video.num_frames = {cfg.video.num_frames}: must be 4k + 1 (the Wan VAE compresses time by 4)")
    # TI2V's Wan2.2 VAE compresses space by 16, I2V-A14B's Wan2.1 VAE by 8; both transformers patch by 2.
    factor = 8 if cfg.model.kind == "i2v_a14b" else 16
    for side in ("height", "width"):
        value = getattr(cfg.video, side)
        if value % (2 * factor):
            found.append(
                f"video.{side} = {value}: must be a multiple of {2 * factor} (model.kind {cfg.model.kind}: VAE "
                f"factor {factor} x patch 2)"
            )
    tile = cfg.grpo.vae_tile_size
    if tile is not None and (tile <= 0 or tile % (4 * factor)):
        found.append(
            f"grpo.vae_tile_size = {tile}: must be a positive multiple of {4 * factor} (model.kind {cfg.model.kind}: "
            f"4 x the VAE factor {factor}, so that the tiles' 3/4 stride is whole latent pixels), or null (no tiling)"
        )
    return found


def _grpo_problems(cfg: Config) -> list[str]:
    """The reference's sampler rules: a Flow-CPS eta in (0, 1] or a per-prompt range, a DanceGRPO eta > 0."""
    found = []
    g = cfg.grpo
    if g.eta_range is not None:
        if len(g.eta_range) != 2 or not 0 <= g.eta_range[0] < g.eta_range[1] <= 1:
            found.append(f"grpo.eta_range = {g.eta_range}: must be [lo, hi] with 0 <= lo < hi <= 1")
        if g.sampler != "flowcps":
            found.append(
                f"grpo.eta_range = {g.eta_range}: per-prompt noise levels need grpo.sampler = 'flowcps', "
                f"not {g.sampler!r}"
            )
    elif g.sampler == "flowcps" and not 0 < g.eta <= 1:
        found.append(
            f"grpo.eta = {g.eta}: Flow-CPS needs 0 < eta <= 1 (0 is the deterministic Euler step, which "
            f"has no log-probability to train)"
        )
    if g.sampler == "dancegrpo" and g.eta <= 0:
        found.append(
            f"grpo.eta = {g.eta}: DanceGRPO needs eta > 0 (its noise std eta sqrt(sigma - sigma') must not vanish)"
        )
    if g.sampler == "flowgrpo_sde" and g.eta <= 0:
        found.append(f"grpo.eta = {g.eta}: Flow-GRPO's sde step needs eta > 0 (its noise std must not vanish)")
    if not 0 < g.timestep_fraction <= 1:
        found.append(f"grpo.timestep_fraction = {g.timestep_fraction}: must be in (0, 1]")
    found += sde_window_problems(g)
    if g.grpo_guard and g.sampler == "flowcps":
        found.append(
            "grpo.grpo_guard = true with grpo.sampler = 'flowcps': GRPO-Guard normalises a Gaussian log-ratio by the "
            "transition's std, and Flow-CPS's log-probability has no variance; use grpo.sampler dancegrpo, flowgrpo or "
            "flowgrpo_sde"
        )
    if g.sampling_steps < 2:
        found.append(f"grpo.sampling_steps = {g.sampling_steps}: must be >= 2 (the last step is never trained)")
    if g.delayed_replay and not g.shared_prompts:
        found.append("grpo.delayed_replay = true: needs grpo.shared_prompts = true (docs/reference-system.md#grpo)")
    return found


MATRIX_MODEL = re.compile(r"^[A-Za-z0-9_.-]+$")


def _matrix_problems(cfg: Config) -> list[str]:
    m = cfg.matrix
    found = [f"matrix.samplers: {why}" for name in m.samplers if (why := sampler_problem(name))]
    for name in m.models:
        if name not in RUN_MODELS and name not in m.hub_models:
            found.append(f"matrix.models: {name!r} is not base, trained, best, ema or a name in matrix.hub_models")
    for name, spec in m.hub_models.items():
        repo_id, _, revision = spec.partition("@")
        if not MATRIX_MODEL.match(name) or name in RUN_MODELS:
            found.append(
                f"matrix.hub_models: {name!r}: use letters, digits, '_', '.', '-' (not base, trained, best or ema)"
            )
        if not repo_id or not HEX40.match(revision):
            case = f" (write {revision.lower()!r})" if HEX40.match(revision.lower()) else ""
            found.append(f"matrix.hub_models.{name} = {spec!r}: must be repo_id@<lower-case 40-hex revision>{case}")
    for duplicate in sorted(
        {x for x in m.models if m.models.count(x) > 1} | {x for x in m.samplers if m.samplers.count(x) > 1}
    ):
        found.append(f"matrix: {duplicate!r} is listed twice")
    if m.eval_set and not HEX64.match(m.eval_set_digest):
        found.append(_eval_set_pin_problem(m.eval_set, m.eval_set_digest))
    if not HEX64.match(m.pipeline_sha256):
        found.append(f"matrix.pipeline_sha256 = {m.pipeline_sha256!r}: must be 64 hex")
    # Only the shape a recipe gives the matrix itself: video.* (what null means) has its own rule.
    for name, value, rule in (
        ("num_frames", m.num_frames, lambda v: (v - 1) % 4 == 0),
        ("height", m.height, lambda v: v % 32 == 0),
        ("width", m.width, lambda v: v % 32 == 0),
    ):
        if value is not None and not rule(value):
            what = "4k + 1" if name == "num_frames" else "a multiple of 32"
            found.append(f"matrix.{name} = {value}: must be {what} (the Wan VAE), or null for video.{name}")
    return found


def _eval_set_pin_problem(tree: str, pinned: str) -> str:
    """An evaluation tree without its pin. The path comes first: no digest can be pinned for a tree that is not
    there. For a tree that is there the message gives the command that prints its digest (hashing a release tree
    of videos here would make every dry run pay for it)."""
    from pathlib import Path

    if not Path(tree).is_dir():
        what = "not a directory" if Path(tree).exists() else "no such directory"
        return (
            f"matrix.eval_set = {tree!r}: {what}; point matrix.eval_set at the release evaluation tree "
            f"(In-Domain_50/, Out-of-Domain_50/ and split_manifest.json) and pin it with matrix.eval_set_digest, or "
            f"leave matrix.eval_set empty to evaluate on the set built from the dataset (matrix.split)"
        )
    command = f'python -c "from videogrpo.provenance.digest import tree_digest; print(tree_digest({tree!r}))"'
    return (
        f"matrix.eval_set_digest = {pinned!r}: the evaluation tree matrix.eval_set = {tree!r} must be pinned by its "
        f"64-hex tree digest; check that the tree is the one to evaluate on, print its digest with {command}, then "
        f"set matrix.eval_set_digest to it"
    )


def _evaluation_set_problems(cfg: Config) -> list[str]:
    """An evaluation set built from the held-out split needs samples held out of training."""
    if not cfg.matrix.eval_set and cfg.matrix.split == "heldout" and cfg.data.heldout_per_task == 0:
        return [
            "matrix.split = 'heldout': data.heldout_per_task is 0, so no sample is held out; set matrix.split to 'rl' "
            "(the first training prompts, with fresh noise), hold samples out (which removes them from training), or "
            "give matrix.eval_set"
        ]
    return []


TRACKERS = ("wandb", "mlflow", "none")


def _logging_problems(cfg: Config) -> list[str]:
    """`logging.tracker` and `logging.wandb_mode` must not say opposite things. `wandb_mode: disabled` with the
    default `[wandb]` keeps meaning no W&B run (as before the list existed); with a list naming wandb beside
    another tracker it asks for W&B and disables it, and `online` without wandb asks for a run that never starts."""
    log = cfg.logging
    trackers = log.tracker
    listed = "[" + ", ".join(map(str, trackers)) + "]"
    found = [
        f"logging.tracker: {name!r} is not one of {', '.join(TRACKERS)}" for name in trackers if name not in TRACKERS
    ]
    if not trackers:
        found.append("logging.tracker = []: name a tracker (wandb, mlflow), or write [none] for none")
    elif "none" in trackers and len(trackers) > 1:
        found.append(f"logging.tracker = {listed}: `none` means no tracker, so it stands alone; drop it or the rest")
    twice = sorted({name for name in trackers if trackers.count(name) > 1})
    found += [f"logging.tracker: {name!r} is listed twice" for name in twice]
    others = [name for name in trackers if name not in ("wandb", "none")]
    if log.wandb_mode == "disabled" and "wandb" in trackers and others:
        found.append(
            f"logging.wandb_mode = 'disabled' with logging.tracker = {listed}: the list asks for a W&B run that the "
            f"mode disables; write logging.tracker: [{', '.join(others)}] (no W&B), or wandb_mode: offline or online"
        )
    if log.wandb_mode == "online" and "wandb" not in trackers:
        found.append(
            f"logging.wandb_mode = 'online' with logging.tracker = {listed}: no W&B run is made; add wandb to "
            f"logging.tracker, or leave wandb_mode at offline"
        )
    return found


def uses_tracker(log: LoggingConfig, name: str) -> bool:
    """Whether a run of these settings logs to tracker `name` (`wandb` or `mlflow`); `wandb_mode: disabled` turns
    W&B off."""
    return name in log.tracker and not (name == "wandb" and log.wandb_mode == "disabled")


def uses_hub_kernel(cfg: Config) -> bool:
    """Whether the attention backend is one of diffusers' Hub-kernel backends (`*_hub`), which load
    parallel.attention_kernel_repo through the `kernels` package, and fetch_kernel then runs."""
    return cfg.parallel.attention_backend.endswith("_hub")


def _parallel_problems(cfg: Config) -> list[str]:
    p = cfg.parallel
    found = []
    if p.device == "cpu" and p.backend == "nccl":
        found.append("parallel.backend = 'nccl': NCCL needs parallel.device = 'cuda'; use 'gloo' on CPU")
    if uses_hub_kernel(cfg):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", p.attention_kernel_repo):
            found.append(
                f"parallel.attention_kernel_repo = {p.attention_kernel_repo!r}: must be a Hub repository id "
                f"'<owner>/<name>' (parallel.attention_backend = {p.attention_backend!r} loads a Hub kernel)"
            )
        if why := revision_problem("parallel.attention_kernel_revision", p.attention_kernel_revision):
            found.append(why)
    if p.offload_gradients and not p.offload_optimizer:
        # The gradients go to the host for a step there; a device AdamW would need them back on the device.
        found.append(
            "parallel.offload_gradients = true: the gradients move to host memory for the optimizer step there, which "
            "needs parallel.offload_optimizer = true; set both, or neither"
        )
    return found


# Each cross-field rule runs when every section it reads is present (stages receive only their sections).
CHECKS = (
    (("model",), _model_problems),
    (("model", "train"), _experts_problems),
    (("data",), _data_problems),
    (("evalkit",), _evalkit_problems),
    (("reward", "evalkit"), _reward_problems),
    (("reward",), _terms_problems),
    (("video",), _video_problems),
    (("grpo",), _grpo_problems),
    # DiffusionNFT's rules read grpo fields beyond those a stage that names the training sampler receives (the
    # report's view: sampler and eta); the stages that receive the whole grpo section receive train too.
    (("grpo", "train"), lambda cfg: nft_problems(cfg.grpo)),
    (("grpo",), lambda cfg: update_problems(cfg.grpo)),
    (("matrix", "data"), _evaluation_set_problems),
    (("parallel",), _parallel_problems),
    (("matrix",), _matrix_problems),
    (("logging",), _logging_problems),
    (("grpo", "parallel", "train"), lambda cfg: topology_problems(cfg)),
    (("actors", "parallel", "train", "model"), lambda cfg: actors_problems(cfg)),
    (("refiners", "grpo", "reward", "parallel", "actors"), lambda cfg: refiner_problems(cfg)),
    (("matrix", "refiners"), refined_model_problems),
    (("parallel", "train"), lora_problems),
    (("train", "data"), validation_problems),
    (("train",), gold_problems),
    (("train", "reward"), gold_overlap_problems),
    (("matrix", "train"), run_model_problems),
    (("train",), ema_problems),
)


def problems(cfg: Config, sections: set[str] | None = None) -> list[str]:
    """Every rule the config breaks, each naming the field, the value and the rule."""
    sections = set(SECTIONS) if sections is None else set(sections)
    found = field_problems(cfg, sections)
    if "recipe" in sections and not re.fullmatch(r"[A-Za-z0-9_.-]+", cfg.recipe):
        found.append(f"recipe = {cfg.recipe!r}: use letters, digits, '_', '.', '-' (it names the run directory)")
    for needed, check in CHECKS:
        if sections.issuperset(needed):
            found += check(cfg)
    return found


def tensor_parallel_problems(world: int, tensor_parallel: int, data_parallel: str) -> list[str]:
    """What breaks a tensor-parallel mesh (parallel.tensor_parallel.mesh_dims raises the first)."""
    if tensor_parallel < 2:
        return [f"parallel.tensor_parallel = {tensor_parallel}: a tensor-parallel mesh needs 2 or more"]
    if world % tensor_parallel:
        return [
            f"parallel.tensor_parallel = {tensor_parallel}: must divide the world size {world}; "
            f"use a world size that is a multiple of {tensor_parallel}"
        ]
    if data_parallel == "hsdp":
        return [
            f"parallel.data_parallel = 'hsdp' with parallel.tensor_parallel = {tensor_parallel}: HSDP is not "
            "combined with tensor parallel (as in the reference); use data_parallel 'fsdp'"
        ]
    if data_parallel == "replicate" and world // tensor_parallel > 1:
        return [
            f"parallel.data_parallel = 'replicate' with parallel.tensor_parallel = {tensor_parallel} and "
            f"{world // tensor_parallel} data replicas (world size {world}): replicated TP shards are not averaged "
            "over the replicas; use data_parallel 'fsdp'"
        ]
    if data_parallel not in ("replicate", "fsdp"):
        return [f"parallel.data_parallel = {data_parallel!r}: use 'fsdp' with tensor parallel"]
    return []


def actors_problems(cfg: Config) -> list[str]:
    """Rollout actor ranks (the `actors` section, docs/options.md#rollout-actors): which ranks train, and what the
    actors cannot do yet."""
    a, par, world = cfg.actors, cfg.parallel, cfg.world_size
    if not (a.train_ranks or a.train_nodes):
        return []
    if a.train_ranks and a.train_nodes:
        return [
            f"actors.train_ranks = {a.train_ranks} and actors.train_nodes = {a.train_nodes}: set one of the two "
            "(train_nodes counts whole nodes of parallel.procs_per_node ranks)"
        ]
    if cfg.train_world_size >= world:
        which = f"train_ranks = {a.train_ranks}" if a.train_ranks else f"train_nodes = {a.train_nodes}"
        return [
            f"actors.{which}: {cfg.train_world_size} train ranks leave none of the {world} ranks (nodes {par.nodes} "
            f"x procs_per_node {par.procs_per_node}) to roll out; train on fewer, or set it to 0 for no actors"
        ]
    found = []
    if a.weight_sync == "lora" and not cfg.train.lora_rank:
        found.append("actors.weight_sync = 'lora' without LoRA (train.lora_rank 0): use 'full' or 'auto'")
    if par.tensor_parallel > 1:
        found.append(
            f"rollout actors with parallel.tensor_parallel = {par.tensor_parallel}: not available (the train ranks' "
            "tensor-parallel pairs would each need every piece of their pair); set parallel.tensor_parallel to 1 "
            "(the A14B's two experts work with actors without it), or actors.train_ranks and train_nodes to 0"
        )
    return found


def topology_problems(cfg: Config) -> list[str]:
    """World size vs prompts vs group size (docs/reference-system.md#grpo, shared-prompt mode): the ranks that
    train (all of them, or the train ranks beside rollout actors)."""
    p, g = cfg.grpo, cfg.parallel
    world = cfg.train_world_size
    if cfg.has_actors:
        sized = flat = f"{world} train ranks (actors.train_ranks / train_nodes)"
    else:
        sized = f"world size {world} (= nodes {g.nodes} x procs_per_node {g.procs_per_node})"
        flat = f"world size {world} = nodes {g.nodes} x procs_per_node {g.procs_per_node}"
    found = []
    if g.tensor_parallel > 1:
        if found := tensor_parallel_problems(world, g.tensor_parallel, g.data_parallel):
            return [f"{found[0]} ({flat})"]
        if p.shared_prompts:
            # assignment.waves deals shared-prompt rows per rank; a TP pair must roll out the same rows.
            return [
                f"grpo.shared_prompts = true with parallel.tensor_parallel = {g.tensor_parallel}: shared-prompt waves "
                "are dealt per rank and the ranks of a TP group must roll out the same rows; set "
                "grpo.shared_prompts: false (prompts dealt per data replica, as the A14B recipe) or tensor_parallel: 1"
            ]
    if g.data_parallel == "hsdp" and world % g.shard_group_size:
        found.append(f"parallel.shard_group_size = {g.shard_group_size}: must divide the {sized}")
    if p.shared_prompts:
        wave = p.prompts_per_wave or p.prompts_per_step
        if p.prompts_per_step % wave:
            found.append(f"grpo.prompts_per_wave = {wave}: must divide grpo.prompts_per_step = {p.prompts_per_step}")
        elif world % wave and wave % world:
            found.append(
                f"{sized} must divide or be a "
                f"multiple of the prompts per wave {wave} (grpo.prompts_per_wave or grpo.prompts_per_step) in "
                f"shared-prompt mode: a rank serves several prompts of a wave, or several ranks share one"
            )
        elif world >= wave and p.group_size % (world // wave):
            found.append(
                f"grpo.group_size = {p.group_size}: must be a multiple of the {world // wave} ranks sharing each "
                f"prompt (world size {world} / {wave} prompts per wave)"
            )
    else:
        replicas = world // g.tensor_parallel
        if p.prompts_per_step != cfg.train.batch_size * replicas:
            # Prompts are dealt per data replica: more nodes grow the global batch unless batch_size shrinks.
            fix = (
                f"; to keep {p.prompts_per_step} prompts per step set train.batch_size: "
                f"{p.prompts_per_step // replicas}"
                if p.prompts_per_step % replicas == 0
                else f"; or set grpo.prompts_per_step: {cfg.train.batch_size * replicas}"
            )
            found.append(
                f"grpo.prompts_per_step = {p.prompts_per_step}: must equal train.batch_size {cfg.train.batch_size} "
                f"x {replicas} data replicas ({flat}, / tensor_parallel {g.tensor_parallel}) = "
                f"{cfg.train.batch_size * replicas}" + fix
            )
    return found


def validate(cfg: Config, sections: set[str] | None = None) -> None:
    found = problems(cfg, sections)
    if found:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(found))
