"""Generation of one matrix cell: every evaluation sample by one model with one sampler.

Samplers (config/cells.py names them): `unipc` (the UniPC ODE: the model's own UniPC scheduler, or diffusers'
UniPC with Wan2.2's flow settings), `euler` (the Euler ODE: diffusers' FlowMatchEulerDiscreteScheduler
with the model's flow shift), `dpm_solver` (training's DPM-Solver++ (2M), DiffusionNFT's rollouts), and training's
own transitions (`grpo.samplers`) over
sigma = shift t / (1 + (shift - 1) t): `flowcps-<noise>`, `dancegrpo-<noise>`, `flowgrpo`, `flowgrpo_sde-<noise>`
and `flowcps-uniform-<lo>-<hi>`, whose every sample draws its noise level from the range. Noise, and a drawn noise
level, are keyed by (matrix.seed, the sample's position, step): the same in every cell, whichever process makes
a sample. Both model kinds sample through `videogrpo.evaluation.sampling`: for TI2V latent
frame 0 is the first frame's latent after every step; for I2V-A14B nothing is pinned and each step goes to
the expert the model's boundary names. A trained cell substitutes the exported transformer (TI2V) or the
exported expert folder(s) (I2V) for the base pipeline's. A cell of the prompt refiners (matrix models `refined`,
`base_refiners`) has each sample's prompt rewritten by them first, their token draws keyed by (matrix.seed, the
sample's position, the refiner), and keeps the rewrites beside the videos (`rewrites/<sample>.json`).

Videos go to `<partial>/<domain>/<task>/<index>.mp4` through a temporary name and are validated
(frames, size, fps) before their rename: a video that exists is complete, so an interrupted cell resumes
with the ones it lacks. Ranks take samples rank, rank + procs, ... (data parallel).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from videogrpo import atomic
from videogrpo.config.cells import Sampler, parse_sampler
from videogrpo.config.identity import generation_settings
from videogrpo.data.video import video_problem, write_mp4
from videogrpo.errors import ConfigError, VideoGRPOError
from videogrpo.evaluation.evalset import EvalSample
from videogrpo.grpo.denoise import ode_scheduler

SEED_TAG = 0xE7A1  # the noise stream of evaluation (training draws from others)
# The key slot of a sample's drawn noise level (a flowcps-uniform cell): after every step number, so that it is
# never a step's noise key.
ETA_DRAW = 1 << 31


def sample_eta(sampler: Sampler, seed: int, index: int) -> float:
    """The noise level sample `index` is generated at: the sampler's own, or its draw from the sampler's range,
    keyed by (seed, index) as training keys its per-prompt draw by (seed, batch, prompt)."""
    from videogrpo.grpo.draws import seeded_uniform

    if sampler.noise_range is None:
        return sampler.noise
    return seeded_uniform(*sampler.noise_range, seed, SEED_TAG, index, ETA_DRAW)


@dataclass(frozen=True)
class Settings:
    steps: int
    guidance_scale: float
    seed: int
    num_frames: int
    height: int
    width: int
    fps: int

    @classmethod
    def from_config(cls, cfg) -> Settings:
        """The cell's settings where the config holds them (config.generation_fields)."""
        return cls(**generation_settings(cfg))


@torch.no_grad()
def generate_video(
    model,
    transformer,
    model_dir: Path,
    sample_dir: Path,
    sample: EvalSample,
    sampler: Sampler,
    s: Settings,
    shift: float,
    prompt: str | None = None,
):
    """uint8 video [F, H, W, 3] of one sample; its noise is keyed by (seed, sample position, step).

    `transformer`: what the model's velocity takes (a TI2V transformer, or an I2V model's experts mapping);
    `prompt`: what the generator reads instead of the sample's prompt (its refiners' rewrite)."""
    from videogrpo.evaluation import sampling
    from videogrpo.grpo.draws import seeded_normal
    from videogrpo.grpo.samplers import sigma_schedule

    if prompt is None:
        prompt = (sample_dir / "prompt.txt").read_text(encoding="utf-8").strip()
    embeds, condition = sampling.encode(
        model, [prompt], [sample_dir / "first_frame.png"], s.height, s.width, s.num_frames
    )
    shape = model.geometry(s.num_frames, s.height, s.width).shape
    device = model.device
    condition = condition.to(device)
    x = seeded_normal(shape, device, s.seed, SEED_TAG, sample.index).unsqueeze(0)
    if sampler.kind in ("unipc", "euler"):
        how = sampling.ODE(ode_scheduler(sampler.kind, model_dir, shift), s.steps)
    elif sampler.kind == "dpm_solver":
        how = sampling.Solver(sigma_schedule(s.steps, shift))
    else:  # a transition of training (grpo.samplers), at the sample's noise level
        how = sampling.SDE(
            sampler.kind,
            sigma_schedule(s.steps, shift),
            sample_eta(sampler, s.seed, sample.index),
            lambda i: seeded_normal(shape, device, s.seed, SEED_TAG, sample.index, i + 1).unsqueeze(0),
        )
    return model.decode(sampling.sample_latents(model, transformer, embeds, condition, x, how, s.guidance_scale))[0]


def generated_problem(path: Path, s: Settings) -> str | None:
    return video_problem(path, s.num_frames, s.width, s.height, s.fps)


def output_problems(videos: Path, samples: list[EvalSample], s: Settings, rewrites: bool = False) -> list[str]:
    """The exact-set check of a cell's videos: one per sample (no missing, no extra), each valid; with prompt
    refiners (`rewrites`), each sample's rewrites beside them too (rewrites/<sample>.json)."""
    expected = [f"{sample.name}.mp4" for sample in samples]
    expected += [rewrite_file(Path(), sample.name).as_posix() for sample in samples] if rewrites else []
    repeated = sorted({name for name in expected if expected.count(name) > 1})
    if repeated:
        return [f"the evaluation list names {name} twice" for name in repeated]
    found = {
        str(p.relative_to(videos))
        for p in videos.rglob("*")
        if p.is_file() and not p.name.startswith(".")  # temporaries of an interrupted attempt
    }
    problems = [f"missing {name}" for name in expected if name not in found]
    problems += [f"extra {name}" for name in sorted(found - set(expected))]
    for name in expected:
        if name.endswith(".mp4") and name in found and (why := generated_problem(videos / name, s)):
            problems.append(f"invalid {name}: {why}")
    return problems


REWRITE_TAG = 0x9E72
"""The counter that sets an evaluation rewrite's token draws apart from the sample's noise draws."""


def rewrite_file(videos: Path, name: str) -> Path:
    return videos / "rewrites" / f"{name}.json"


def cell_refiners(given: list[str], settings_json: str | None) -> dict[str, tuple[Path, object]]:
    """The cell's prompt refiners in the refiners section's order: {name: (folder, its refiners.experts record)}."""
    from videogrpo.config import refiner_paths
    from videogrpo.config.refiners_section import RefinersConfig
    from videogrpo.config.types import build

    folders = refiner_paths(given)
    if not folders:
        return {}
    if settings_json is None:
        raise ConfigError("--refiner needs --refiners-json: the refiners section, whose settings they sample with")
    section = build(RefinersConfig, json.loads(settings_json), "refiners")
    named = [e.name for e in section.experts]
    if sorted(named) != sorted(folders):
        raise ConfigError(f"--refiner gives {sorted(folders)}; the refiners section names {named}")
    return {e.name: (folders[e.name], e) for e in section.experts}


def rewrite_prompt(chain, prompt: str, seed: int, index: int, image: Path | None = None):
    """A sample's prompt rewritten by the cell's refiners in turn (grpo.refiners.rewrite_chain), its tokens drawn
    at uniforms keyed by (seed, sample position, refiner)."""
    from videogrpo.grpo.draws import keyed_uniforms
    from videogrpo.grpo.refiners import rewrite_chain

    def uniforms(k: int, n: int) -> list[float]:
        return keyed_uniforms(n, seed, REWRITE_TAG, index, k)

    return rewrite_chain(chain, prompt, uniforms, image)


def temporary_name(target: Path, rank: int) -> Path:
    return target.with_name(f".{target.stem}.tmp-rank{rank}-pid{os.getpid()}.mp4")


def generate_rank(
    rank: int,
    procs: int,
    cfg,
    model_dir: Path,
    transformer_dir: Path | None,
    tree: Path,
    samples: list[EvalSample],
    sampler_name: str,
    partial: Path,
    device_kind: str,
    transformer_2_dir: Path | None = None,
    progress=None,
    refiners: dict | None = None,
) -> int:
    """Generate this rank's samples that have no valid video yet; returns how many it generated.

    `transformer_dir` / `transformer_2_dir`: trained folders replacing the pipeline's `transformer` (TI2V's, or
    I2V's high-noise expert) and `transformer_2` (I2V's low-noise expert); None keeps the pipeline's own."""
    from videogrpo.evaluation import sampling
    from videogrpo.models.wan import scheduler_flow_shift

    torch.set_num_threads(cfg.parallel.cpu_threads)
    device = torch.device("cuda", rank) if device_kind == "cuda" else torch.device("cpu")
    s = Settings.from_config(cfg)
    sampler = parse_sampler(sampler_name)
    if transformer_2_dir is not None and cfg.model.kind != "i2v_a14b":
        raise ConfigError(
            f"model.kind = {cfg.model.kind!r} has no transformer_2; {transformer_2_dir} is for an i2v_a14b model"
        )
    refiners = refiners or {}

    def missing(sample) -> bool:  # its video, or with refiners its rewrites, is not there yet
        if refiners and not rewrite_file(partial, sample.name).is_file():
            return True
        return generated_problem(partial / f"{sample.name}.mp4", s) is not None

    mine = [sample for sample in samples[rank::procs] if missing(sample)]
    if progress:
        progress.update(len(samples[rank::procs]) - len(mine))
    if not mine:
        return 0
    model = sampling.load_model(cfg, model_dir, device)
    if sampling.is_i2v(model):
        folders = {"high": transformer_dir, "low": transformer_2_dir}
        substituted = {name: Path(folder) for name, folder in folders.items() if folder is not None}
        transformer = sampling.substitute_experts(model, substituted, cfg.parallel.attention_backend)
    elif transformer_dir is not None:
        transformer = sampling.trained_transformer(transformer_dir, model_dir, device, cfg)
    else:
        transformer = model.transformer
    sampling.eval_mode(transformer)
    shift, _ = scheduler_flow_shift(model_dir)  # every cell samples as its model's scheduler says
    from videogrpo.models.refiner import Refiner

    chain = []
    for name, (folder, settings) in refiners.items():
        refiner = Refiner.load(folder, device)
        refiner.model.eval()
        chain.append((name, refiner, settings))
    for sample in mine:
        prompt = None
        if chain:  # the refiners' rewrite, kept beside the video (written first: a resume reads it again)
            original = (tree / sample.name / "prompt.txt").read_text(encoding="utf-8").strip()
            rewrites = rewrite_prompt(chain, original, s.seed, sample.index, tree / sample.name / "first_frame.png")
            prompt = rewrites[-1].text_out
            from videogrpo.grpo.refiners import public_record

            record = {"sample": sample.name, "original": original, "generator_prompt": prompt}
            record["rewrites"] = [public_record(r) for r in rewrites]
            atomic.write_json(rewrite_file(partial, sample.name), record)
        frames = generate_video(
            model, transformer, model_dir, tree / sample.name, sample, sampler, s, shift, prompt=prompt
        )
        target = partial / f"{sample.name}.mp4"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_name(target, rank)
        write_mp4(tmp, frames, fps=s.fps)
        if why := generated_problem(tmp, s):
            raise VideoGRPOError(f"{tmp}: the generated video failed validation ({why})")
        os.replace(tmp, target)
        if progress:
            progress.update()
    return len(mine)


def _spawned_rank(rank: int, *args) -> None:
    generate_rank(rank, *args)


def generate_cell(
    cfg,
    model_dir,
    transformer_dir,
    tree,
    samples,
    sampler_name,
    partial: Path,
    progress=None,
    transformer_2_dir=None,
    refiners=None,
) -> None:
    """Every sample's video of the cell under `partial` (resuming), over matrix.procs processes; trained folders
    as in generate_rank."""
    procs = cfg.matrix.procs
    device_kind = cfg.parallel.device
    if device_kind == "cuda" and procs > torch.cuda.device_count():
        raise ConfigError(f"matrix.procs = {procs}: this node has {torch.cuda.device_count()} GPUs")
    partial.mkdir(parents=True, exist_ok=True)
    args = (
        procs,
        cfg,
        model_dir,
        transformer_dir,
        tree,
        samples,
        sampler_name,
        partial,
        device_kind,
        transformer_2_dir,
        None,
        refiners,
    )
    if procs == 1:
        generate_rank(0, *args[:-2], progress=progress, refiners=refiners)
        return
    import torch.multiprocessing as mp

    try:
        mp.spawn(_spawned_rank, args=args, nprocs=procs, join=True)
    except mp.ProcessRaisedException as err:
        raise VideoGRPOError(f"a generation process failed:\n{err}") from None
    except mp.ProcessExitedException as err:
        raise VideoGRPOError(f"a generation process died ({err}); the videos it completed are kept") from None
