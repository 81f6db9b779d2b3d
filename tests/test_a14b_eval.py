"""Evaluation and the matrix on the two-expert I2V-A14B model (tiny, CPU): sampling against diffusers' own
WanImageToVideoPipeline, routing, the trained experts substituted, a tampered export refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from videogrpo import config, models
from videogrpo.demo.tiny_i2v import save_tiny_i2v_pipeline
from videogrpo.demo.tiny_ti2v import FLOW_SHIFT
from videogrpo.errors import ConfigError
from videogrpo.evaluation import sampling
from videogrpo.evaluation.generate import SEED_TAG, Settings, generate_video, ode_scheduler, parse_sampler
from videogrpo.grpo.draws import seeded_normal
from videogrpo.grpo.samplers import sigma_schedule
from videogrpo.models.i2v import EXPERT_FOLDERS, WanI2VA14B, expert_schedule, route, timestep_of
from videogrpo.provenance.manifest import StageRun

from conftest import TASKS
from harness import trainer_config

FRAMES, HEIGHT, WIDTH = 9, 32, 48
CPU = torch.device("cpu")
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def tiny_i2v(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("i2v") / "pipeline"
    save_tiny_i2v_pipeline(out, seed=0)
    return out


@pytest.fixture(scope="module")
def pipe(tiny_i2v):
    from diffusers import WanImageToVideoPipeline

    return WanImageToVideoPipeline.from_pretrained(str(tiny_i2v))


def i2v_config(**sections) -> config.Config:
    """The tiny default as an i2v_a14b run (its fields as the matrix's stages read them)."""
    return config.from_dict(
        trainer_config(
            model={"kind": "i2v_a14b", "max_text_tokens": 32},
            # Square: the config's geometry check still applies TI2V's VAE factor (16) to every kind.
            video={"num_frames": FRAMES, "height": 32, "width": 32},
            **sections,
        )
    )


def sample_dir(root: Path, seed: int) -> Path:
    from PIL import Image

    root.mkdir(parents=True)
    (root / "prompt.txt").write_text("a red square moves right\n")
    image = np.random.default_rng(seed).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    Image.fromarray(image).save(root / "first_frame.png")
    return root


def count_calls(experts: dict) -> tuple[list[str], list]:
    """Forward hooks recording which expert ran, in order."""
    seen: list[str] = []
    handles = [m.register_forward_hook(lambda *_, n=name: seen.append(n)) for name, m in experts.items()]
    return seen, handles


def perturbed_export(tiny_i2v: Path, final: Path, experts: tuple[str, ...], scale: float = 0.2) -> None:
    """train's export as it will be: the trained experts' Diffusers folders (and training_state.json)."""
    from diffusers import WanTransformer3DModel

    for i, name in enumerate(experts):
        expert = WanTransformer3DModel.from_pretrained(tiny_i2v / EXPERT_FOLDERS[name])
        generator = torch.Generator().manual_seed(11 + i)
        with torch.no_grad():
            for p in expert.parameters():
                p.add_(scale * torch.randn(p.shape, generator=generator))
        expert.save_pretrained(final / EXPERT_FOLDERS[name])
    (final / "training_state.json").write_text(json.dumps({"experts": list(experts)}))


@pytest.mark.parametrize(("kind", "guidance"), [("euler", 1.0), ("unipc", 1.0), ("euler", 3.0)])
def test_the_matrix_ode_sampling_equals_the_diffusers_i2v_pipeline(tiny_i2v, pipe, tmp_path, kind, guidance):
    """The matrix's ODE cell (generate_video, through sampling.sample_latents) against WanImageToVideoPipeline's
    own loop from the same noise, scheduler and embeddings: the same latents to the bit, each step on the
    expert the boundary names (hooks), both experts serving, and the decoded video within rounding."""
    from PIL import Image

    model = WanI2VA14B(tiny_i2v, CPU, max_text_tokens=32, condition_dtype="float32")
    s = Settings(steps=6, guidance_scale=guidance, seed=0, num_frames=FRAMES, height=HEIGHT, width=WIDTH, fps=16)
    where = sample_dir(tmp_path / "sample", seed=1)
    noise = seeded_normal(model.geometry(FRAMES, HEIGHT, WIDTH).shape, CPU, s.seed, SEED_TAG, 3).unsqueeze(0)
    embeds = model.encode_prompts(["a red square moves right"])
    image = np.asarray(Image.open(where / "first_frame.png"))
    condition = model.encode_first_frames(image[None], FRAMES)
    scheduler = ode_scheduler(kind, tiny_i2v, FLOW_SHIFT)
    seen, handles = count_calls(model.experts)
    try:
        ours = sampling.sample_latents(
            model, model.experts, embeds, condition, noise, sampling.ODE(scheduler, s.steps), guidance
        )
    finally:
        for handle in handles:
            handle.remove()
    pipe.scheduler = ode_scheduler(kind, tiny_i2v, FLOW_SHIFT)
    common = dict(
        image=Image.fromarray(image),
        prompt_embeds=embeds,
        negative_prompt_embeds=torch.zeros_like(embeds) if guidance > 1 else None,
        height=HEIGHT,
        width=WIDTH,
        num_frames=FRAMES,
        num_inference_steps=s.steps,
        guidance_scale=guidance,
    )
    theirs = pipe(**common, latents=noise.clone(), output_type="latent").frames
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    expected = [route(timestep_of(float(t) / 1000), model.boundary, model.loaded) for t in scheduler.timesteps]
    assert seen == [name for name in expected for _ in range(2 if guidance > 1 else 1)]
    assert {"high", "low"} == set(seen)
    video = generate_video(
        model, model.experts, tiny_i2v, where, _sample(3), parse_sampler(kind), s, FLOW_SHIFT
    ).astype(int)
    theirs_video = pipe(**common, latents=noise.clone(), output_type="np").frames[0]
    assert video.shape == (FRAMES, HEIGHT, WIDTH, 3)
    assert np.abs(video - np.round(theirs_video * 255)).max() <= 1


def _sample(index: int):
    from videogrpo.evaluation.evalset import EvalSample

    return EvalSample(index, "In-Domain_50", TASKS[0], "00000", "x")


def test_nothing_is_pinned_and_the_flowcps_cell_routes_every_step(tiny_i2v, tmp_path):
    """A Flow-CPS cell: every step on the expert the boundary names; latent frame 0 evolves (I2V pins nothing),
    and the noise is the matrix's own (the same sample gives the same video, another sample another)."""
    model = WanI2VA14B(tiny_i2v, CPU, max_text_tokens=32, condition_dtype="float32")
    s = Settings(steps=8, guidance_scale=1.0, seed=0, num_frames=FRAMES, height=HEIGHT, width=WIDTH, fps=16)
    where = sample_dir(tmp_path / "sample", seed=2)
    latents = []
    original = sampling.sample_latents

    def keep(*args, **kwargs):
        latents.append(original(*args, **kwargs))
        return latents[-1]

    seen, handles = count_calls(model.experts)
    sampling.sample_latents = keep
    try:
        first = generate_video(model, model.experts, tiny_i2v, where, _sample(0), parse_sampler("flowcps-0.7"), s, 5.0)
        again = generate_video(model, model.experts, tiny_i2v, where, _sample(0), parse_sampler("flowcps-0.7"), s, 5.0)
        other = generate_video(model, model.experts, tiny_i2v, where, _sample(1), parse_sampler("flowcps-0.7"), s, 5.0)
    finally:
        sampling.sample_latents = original
        for handle in handles:
            handle.remove()
    assert seen == expert_schedule(sigma_schedule(8, 5.0), model.boundary, model.loaded) * 3
    assert seen[:8] == ["high"] * 4 + ["low"] * 4
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    from PIL import Image

    init = seeded_normal(model.geometry(FRAMES, HEIGHT, WIDTH).shape, CPU, 0, SEED_TAG, 0)
    with Image.open(where / "first_frame.png") as image:
        condition = model.encode_first_frames(np.asarray(image)[None], FRAMES)
    frame0 = latents[0][0, :, 0]
    assert not torch.allclose(frame0, init[:, 0]) and not torch.allclose(frame0, condition[0, 4:, 0])


@pytest.mark.parametrize("experts", ["both", "high", "low"])
def test_the_trained_model_is_the_base_with_the_exported_experts_substituted(tiny_i2v, tmp_path, experts):
    """A trained cell's model: each exported expert folder replaces its base expert, the other stays the base's;
    generation (the A14B recipe's check column, each sample's eta drawn from [0, 1]) routes every step to the
    expert the boundary names, the substituted ones included, and its videos differ from the base's only through
    the substituted experts."""
    from diffusers import WanTransformer3DModel

    trained = models.EXPORTED_EXPERTS[experts]
    names = tuple(name for name, folder in EXPERT_FOLDERS.items() if folder in trained)
    perturbed_export(tiny_i2v, tmp_path / "final", names)
    cfg = i2v_config()
    cfg.train.experts = experts  # the two-expert trainer's field (absent from this branch's config)
    s = Settings(steps=8, guidance_scale=1.0, seed=0, num_frames=FRAMES, height=HEIGHT, width=WIDTH, fps=16)
    where = sample_dir(tmp_path / "sample", seed=3)
    sampler = parse_sampler("flowcps-uniform-0.0-1.0")
    model = sampling.load_model(cfg, tiny_i2v, CPU)

    def videos(weights) -> np.ndarray:
        return np.stack(
            [generate_video(model, weights, tiny_i2v, where, _sample(i), sampler, s, FLOW_SHIFT) for i in (0, 1)]
        )

    base = videos(sampling.eval_mode(sampling.base_weights(model)))
    base_state = {name: {k: v.clone() for k, v in e.state_dict().items()} for name, e in model.experts.items()}
    weights = sampling.trained_weights(cfg, model, tmp_path / "final")
    assert set(weights) == {"high", "low"} and weights == model.experts
    for name, expert in weights.items():
        source = tmp_path / "final" / EXPERT_FOLDERS[name] if name in names else tiny_i2v / EXPERT_FOLDERS[name]
        saved = WanTransformer3DModel.from_pretrained(source).state_dict()
        assert all(torch.equal(expert.state_dict()[k], saved[k]) for k in saved), name
        unchanged = all(torch.equal(expert.state_dict()[k], base_state[name][k]) for k in saved)
        assert unchanged == (name not in names), name
    seen, handles = count_calls(weights)
    try:
        made = videos(weights)
    finally:
        for handle in handles:
            handle.remove()
    schedule = expert_schedule(sigma_schedule(8, FLOW_SHIFT), model.boundary, ("high", "low"))
    assert seen == schedule * 2 and set(seen) == {"high", "low"}  # one forward per step and sample
    assert made.shape == (2, FRAMES, HEIGHT, WIDTH, 3) and not np.array_equal(made, base)


@pytest.mark.parametrize(
    ("experts", "written", "message"),
    [
        ("both", ("high",), "lacks"),
        ("high", ("low",), "lacks"),
        ("high", ("high", "low"), "also holds"),
        ("middle", ("high",), "use both, high or low"),
    ],
)
def test_an_export_that_disagrees_with_train_experts_is_refused(tiny_i2v, tmp_path, experts, written, message):
    for name in written:
        (tmp_path / "final" / EXPERT_FOLDERS[name]).mkdir(parents=True)
    cfg = i2v_config()
    cfg.train.experts = experts
    with pytest.raises(ConfigError, match=message):
        sampling.exported_folders(cfg, tmp_path / "final")


def test_the_workflow_names_the_exported_folders_of_the_trained_experts():
    cfg = i2v_config()
    assert models.trained_folders(cfg) == ("transformer", "transformer_2")
    assert set(models.EXPORTED_EXPERTS["both"]) == set(EXPERT_FOLDERS.values())
    for expert in ("high", "low"):
        cfg.train.experts = expert
        assert models.trained_folders(cfg) == (EXPERT_FOLDERS[expert],)
    assert models.trained_folders(config.from_dict(trainer_config())) == ("transformer",)


def test_an_i2v_runs_check_cells_score_trained_against_base(tiny_i2v, dataset, tmp_path):
    """The held-out check of an I2V run: its trained cell (both exported experts substituted) and base cell
    generated on the evaluation set built from the held-out split, scored, and paired per task."""
    from videogrpo.evaluation.aggregate import ALL, per_task_table
    from videogrpo.evaluation.evalset import DATASET_FINAL_FRAME, dataset_samples, eval_samples, write_dataset_tree
    from videogrpo.evaluation.generate import generate_rank
    from videogrpo.evaluation.score import score_cell

    perturbed_export(tiny_i2v, tmp_path / "final", ("high", "low"))
    cfg = i2v_config(grpo={"sampling_steps": 4})  # the cells sample with the training steps, at video.*
    placed = write_dataset_tree(tmp_path / "tree", dataset_samples(dataset, "heldout", None))
    samples = eval_samples(tmp_path / "tree", len(placed))
    for name, ref in placed.items():
        (tmp_path / "ff" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ff" / f"{name}.png").write_bytes((ref.directory / DATASET_FINAL_FRAME).read_bytes())
    sampler = "flowcps-0.7"  # the tiny default's training sampler
    experts = {"transformer_dir": tmp_path / "final/transformer", "transformer_2_dir": tmp_path / "final/transformer_2"}
    scores = {}
    for model, folders in (("base", {"transformer_dir": None}), ("trained", experts)):
        videos = tmp_path / model
        folders = dict(folders)
        first = folders.pop("transformer_dir")
        made = generate_rank(0, 1, cfg, tiny_i2v, first, tmp_path / "tree", samples, sampler, videos, "cpu", **folders)
        assert made == len(TASKS)
        scores[(model, sampler)], errors = score_cell(
            cfg, Path(cfg.evalkit.path), tmp_path / "tree", tmp_path / "ff", samples, videos, tmp_path / f"{model}-work"
        )
        assert not errors
    table = per_task_table(scores, "base", 100, 0)
    overall = table[(table.model == "trained") & (table.task == ALL)].iloc[0]
    base = table[(table.model == "base") & (table.task == ALL)].iloc[0]
    assert overall.samples == len(TASKS) and overall.delta_vs_base == pytest.approx(overall["mean"] - base["mean"])
    from videogrpo.provenance.digest import tree_digest

    assert all(len(list((tmp_path / m).rglob("*.mp4"))) == len(TASKS) for m in ("base", "trained"))
    assert tree_digest(tmp_path / "trained") != tree_digest(tmp_path / "base")  # the substituted experts sampled


# The matrix's generate-cell stage through its CLI: inputs checked against the manifests of the stages that made
# them (train's export, fetch_model's pipeline, eval_set's list), as the workflow runs it.
MATRIX = {"expected_samples": len(TASKS), "seed": 0, "procs": 1}
GENERATION = {
    "model": {"source": "tiny", "kind": "i2v_a14b", "repo_id": "", "revision": "", "max_text_tokens": 32},
    "parallel": {"device": "cpu", "backend": "gloo", "attention_backend": "native", "cpu_threads": 1},
    "video": {"num_frames": FRAMES, "height": 32, "width": 32, "fps": 16},
    "grpo": {"sampling_steps": 4},
    "matrix": MATRIX,
}


def stage(name: str, sections: dict, *args: str) -> subprocess.CompletedProcess:
    command = [str(BIN / "videogrpo"), "stage", name, "--config-json", json.dumps(sections), *args]
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(command, env=environment, capture_output=True, text=True)


@pytest.fixture(scope="module")
def upstream(tiny_i2v, tmp_path_factory) -> tuple[Path, list[str]]:
    """eval_set's samples.json (synthetic tree) and the manifests of fetch_model and train (the export)."""
    from videogrpo.demo.synthetic_eval_tree import write_synthetic_tree
    from videogrpo.provenance.digest import tree_digest

    root = tmp_path_factory.mktemp("a14b-matrix")
    tree = root / "tree"
    write_synthetic_tree(tree, TASKS, 1, seed=0, frames=17, height=64, width=64, fps=16)
    sections = {"matrix": dict(MATRIX, eval_set=str(tree), eval_set_digest=tree_digest(tree))}
    out = stage(
        "eval-set",
        sections,
        *("--tree", str(tree), "--samples", str(root / "samples.json")),
        *("--final-frames", str(root / "final_frames"), "--manifest", str(root / "eval_set.manifest.json")),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    with StageRun("fetch_model", root / "fetch_model.manifest.json", inputs={}) as made:
        made.output("model", tiny_i2v)
    perturbed_export(tiny_i2v, root / "final", ("high", "low"))
    with StageRun("train", root / "train.manifest.json", inputs={}) as made:
        made.output("final", root / "final")
    manifests = [f"--upstream={root / m}.manifest.json" for m in ("eval_set", "fetch_model", "train")]
    return root, manifests


def cell_args(root: Path, manifests: list[str], out: Path, *trained: str) -> list[str]:
    return [
        *trained,
        *("--samples", str(root / "samples.json"), "--sampler", "euler"),
        *("--videos", str(out / "videos"), "--work", str(out / "work"), "--manifest", str(out / "m.json")),
        *manifests,
    ]


def test_generate_cell_runs_an_i2v_trained_cell_and_refuses_a_tampered_expert(tiny_i2v, upstream, tmp_path):
    """The trained cell's two expert folders are inputs checked against train's manifest: the cell's videos
    differ from the base cell's; an expert folder changed after train made it is refused before generation."""
    from videogrpo.provenance.digest import tree_digest

    root, manifests = upstream
    model = ("--model", str(tiny_i2v))
    experts = ("--transformer", str(root / "final/transformer"), "--transformer-2", str(root / "final/transformer_2"))
    base = stage("generate-cell", GENERATION, *model, *cell_args(root, manifests, tmp_path / "base"))
    assert base.returncode == 0, base.stderr[-3000:]
    trained = stage("generate-cell", GENERATION, *model, *cell_args(root, manifests, tmp_path / "trained", *experts))
    assert trained.returncode == 0, trained.stderr[-3000:]
    made = sorted(p.relative_to(tmp_path / "trained/videos") for p in (tmp_path / "trained/videos").rglob("*.mp4"))
    assert len(made) == len(TASKS)
    assert tree_digest(tmp_path / "trained/videos") != tree_digest(tmp_path / "base/videos")
    inputs = json.loads((tmp_path / "trained/m.json").read_text())["inputs"]
    assert inputs["transformer_2"]["tree_sha256"] == tree_digest(root / "final/transformer_2")
    assert inputs["transformer"]["tree_sha256"] == tree_digest(root / "final/transformer")
    weights = root / "final/transformer_2/diffusion_pytorch_model.safetensors"
    original = weights.read_bytes()
    try:
        weights.write_bytes(original[:-4] + bytes(4))
        refused = stage(
            "generate-cell", GENERATION, *model, *cell_args(root, manifests, tmp_path / "tampered", *experts)
        )
    finally:
        weights.write_bytes(original)
    assert refused.returncode != 0 and "input transformer_2 is not what train made" in refused.stderr, refused.stderr
    assert "diffusion_pytorch_model.safetensors" in refused.stderr
    assert not (tmp_path / "tampered/videos").exists() and not (tmp_path / "tampered/work").exists()


def test_a_two_expert_pipeline_validates_with_both_experts_loaded(tiny_i2v, monkeypatch):
    """fetch_eval_model's full load of an I2V pipeline (validate_pipeline with load) reads both experts."""
    from diffusers import WanTransformer3DModel

    from videogrpo.evaluation.pipelines import validate_pipeline

    loads = []
    original = WanTransformer3DModel.from_pretrained.__func__

    def spy(cls, path, *args, **kwargs):
        loads.append(Path(path).name)
        return original(cls, path, *args, **kwargs)

    monkeypatch.setattr(WanTransformer3DModel, "from_pretrained", classmethod(spy))
    record = validate_pipeline(tiny_i2v, "0" * 64, load=True)
    assert record["weights_loaded"] and "transformer_2" in record["components"]
    assert record["shapes"]["transformer_2"]["shapes"] == "as its config implies"
    assert sorted(loads) == ["transformer", "transformer_2"]
