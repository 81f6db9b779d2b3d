"""DiffusionNFT (grpo.algorithm nft, docs/options.md#diffusionnft): its config rules, the old policy (decay, mix,
swap, reset), and runs of the tiny default that train it on one rank, resume it from a checkpoint, and shard it
with FSDP over two torchrun ranks. Its objective against its authors' code: tests/test_algo_diff.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.grpo import nft, sde_window
from videogrpo.grpo.weight_copy import WeightCopy

from harness import adam_tolerance, metrics, solo_config, tensors, train, train_in_process, trainer_config, weights

NFT = {"algorithm": "nft", "sampler": "euler", "share_group_noise": False, "delayed_replay": False}


@pytest.mark.parametrize(
    "grpo, message",
    [
        ({"sampler": "euler"}, "grpo.sampler = 'euler': the deterministic ODE has no log-probability"),
        ({"sampler": "dpm_solver"}, "grpo.sampler = 'dpm_solver': the deterministic ODE has no log-probability"),
        ({**NFT, "sampler": "dpm_solver", "share_group_noise": True}, "every member of a group the same video"),
        ({**NFT, "delayed_replay": True}, "grpo.delayed_replay = true with grpo.algorithm = 'nft'"),
        ({**NFT, "sampler": "dancegrpo", "grpo_guard": True}, "grpo.grpo_guard = True with grpo.algorithm = 'nft'"),
        ({**NFT, "sde_window_size": 2}, "grpo.sde_window_size = 2 with grpo.algorithm = 'nft'"),
        ({**NFT, "share_group_noise": True}, "every member of a group the same video"),
        ({**NFT, "nft_old_decay_max": 1.0}, r"grpo.nft_old_decay_max = 1.0: must be in \[0, 1\)"),
        ({**NFT, "nft_beta": 0}, "grpo.nft_beta"),
    ],
)
def test_what_cannot_work_with_nft_is_refused_with_the_reason(grpo, message):
    with pytest.raises(ConfigError, match=message):
        config.from_dict({"grpo": grpo, "train": {}}, partial=True)  # the sections the rules read


def test_the_dpm_solvers_rollout_and_its_matrix_cell_sample_alike():
    """One solver for training's dpm_solver rollouts and the held-out check's dpm_solver cell (grpo.denoise): the
    same clean latent from the same noise, frame 0 pinned to the condition in both."""
    from types import SimpleNamespace

    from videogrpo.grpo import denoise, rollout
    from videogrpo.grpo.samplers import sigma_schedule

    generator = torch.Generator().manual_seed(3)
    mix = torch.randn(4, 4, generator=generator)
    model = SimpleNamespace(
        pins_first_frame=True,
        trajectory_dtype=torch.float32,
        velocity=lambda transformer, x, sigma, embeds, guidance: torch.einsum("dc,bc...->bd...", mix, x) * sigma,
    )
    noise, condition = torch.randn(2, 4, 3, 4, 4, generator=generator), torch.randn(2, 4, 1, 4, 4, generator=generator)
    sigmas = sigma_schedule(8, 3.0)
    trajectory = rollout.rollout(model, None, None, condition, noise, sigmas, "dpm_solver", torch.zeros(2), None)
    sampled = denoise.sample_latents(model, None, None, condition, noise, denoise.Solver(sigmas))
    torch.testing.assert_close(sampled, trajectory.latents[:, -1], rtol=1e-6, atol=1e-6)
    assert torch.equal(sampled[:, :, :1], condition) and not torch.equal(sampled, noise)
    assert torch.equal(trajectory.log_probs, torch.zeros(2, 8))  # deterministic: nothing to replay


def test_nft_is_a_new_run_and_its_fields_count_only_then():
    base = config.from_dict(trainer_config())
    on = config.from_dict(trainer_config(grpo=NFT))
    assert config.run_identity(on) != config.run_identity(base)
    moved = config.from_dict(trainer_config(grpo={"nft_beta": 0.5}))  # off: the field is not part of the run
    assert config.run_identity(moved) == config.run_identity(base)


def test_the_old_policy_decays_as_its_authors_schedule():
    assert [nft.old_decay(u, 0.1, 0.25, 2) for u in (0, 1, 2, 3, 4, 5)] == [0.0, 0.0, 0.0, 0.1, 0.2, 0.25]


def test_the_old_policy_swaps_in_mixes_and_resets():
    model = torch.nn.Linear(3, 2)
    params = list(model.parameters())
    old = WeightCopy(params, [model])
    start = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
    x = torch.randn(4, 3)
    with old.swapped_in():
        assert torch.equal(model(x), torch.nn.functional.linear(x, start[0], start[1]))
    assert all(torch.equal(p, s + 1) for p, s in zip(params, start))  # the trained weights are back
    old.mix(0.25)
    assert all(torch.allclose(c, 0.25 * s + 0.75 * (s + 1)) for c, s in zip(old.copies, start))
    old.reset()
    assert all(torch.equal(c, p) for c, p in zip(old.copies, params))


def test_nft_trains_its_noise_levels_on_the_dpm_solver_and_resumes_with_its_old_policy_and_average(
    tiny_model, dataset, tmp_path, capfd
):
    """Two updates of 8 sampling steps (DiffusionNFT's DPM-Solver rollouts) at fraction 0.6 (4 noise levels each, not
    GRPO's 4 of the first 7); on the first the old policy is the trained one, so both implicit policies are it
    (L+ = L-); the old policy decays at 0.3 per update and is checkpointed, and so is the moving average of the
    weights (train.ema_decay, two blends an update: one before the next update's step): resuming after update 1 ends
    bit-identical to the run that did not stop, its ema/ export included."""
    grpo = {**NFT, "sampler": "dpm_solver", "nft_old_decay_rate": 0.3, "nft_old_decay_max": 0.5}
    train = {"max_steps": 2, "save_steps": 1, "keep_checkpoints": 3, "ema_decay": 0.9, "ema_repeats": 2}
    cfg = solo_config(train=train, grpo=grpo)
    whole = train_in_process(cfg, tmp_path / "whole", tiny_model, dataset)
    ema = lambda out: (out / "ema/transformer/diffusion_pytorch_model.safetensors").read_bytes()  # noqa: E731
    record = json.loads((whole / "ema/training_state.json").read_text())["ema"]
    assert record == {"decay": 0.9, "every": 1, "repeats": 2, "updates": 2, "blends": 4}
    assert ema(whole) != weights(whole)  # an average, not the last weights
    rows = metrics(whole)
    g = config.from_dict(cfg).grpo
    assert [m["trained_timesteps"] for m in rows] == [sde_window.nft_count(g.sampling_steps, 0.6)] * 2 == [4, 4]
    assert rows[0]["nft_positive_loss"] == rows[0]["nft_negative_loss"] > 0
    assert rows[1]["nft_positive_loss"] != rows[1]["nft_negative_loss"]
    assert "ppo_ratio_mean" not in rows[0] and 0 < rows[0]["nft_optimality_mean"] < 1
    assert rows[0]["grad_norm"] > 0

    capfd.readouterr()
    resumed = tmp_path / "resumed"
    shutil.copytree(whole / "checkpoints/step-00000001", resumed / "checkpoints/step-00000001")
    train_in_process(cfg, resumed, tiny_model, dataset)
    assert "resumed from" in capfd.readouterr().err
    assert weights(resumed) == weights(whole) and ema(resumed) == ema(whole)

    # Without its old policy the resumed update is another one: the checkpoint's copy is what made it identical.
    stale = tmp_path / "stale"
    shutil.copytree(whole / "checkpoints/step-00000001", stale / "checkpoints/step-00000001")
    state = stale / "checkpoints/step-00000001/state.json"
    saved = json.loads(state.read_text())
    assert saved["extra"] == ["ema", "nft_old"]
    state.write_text(json.dumps(dict(saved, extra=[])))
    train_in_process(cfg, stale, tiny_model, dataset)
    err = capfd.readouterr().err
    assert "the old policy starts as the loaded weights" in err and "the average starts as the loaded weights" in err
    assert weights(stale) != weights(whole) and ema(stale) != ema(whole)


def test_nft_under_fsdp_trains_what_replicate_trains(tiny_model, dataset, tmp_path):
    """Two torchrun ranks: the old policy's swaps reshard FSDP's gathered weights, so its velocity is the old one and
    the update the one replicated weights make."""
    runs = {}
    for layout in ("fsdp", "replicate"):
        cfg = trainer_config(
            train={"max_steps": 2, "save_steps": 2},
            grpo={**NFT, "nft_old_decay_rate": 0.3},
            parallel={"data_parallel": layout},
        )
        assert train(cfg, tmp_path / layout, tiny_model, dataset)
        runs[layout] = tensors(tmp_path / layout)
    fsdp, replicate = metrics(tmp_path / "fsdp")[1], metrics(tmp_path / "replicate")[1]
    # L+ - L- is the old policy's distance from the trained one: a swap that left FSDP's root gathered with the
    # trained weights moved it by a fifth (seen), where the layouts' round-off moves it by a thousandth.
    gap = {name: m["nft_positive_loss"] - m["nft_negative_loss"] for name, m in (("f", fsdp), ("r", replicate))}
    assert gap["f"] != 0 and gap["f"] == pytest.approx(gap["r"], rel=0.01)
    for key in runs["fsdp"]:
        assert (runs["fsdp"][key] - runs["replicate"][key]).abs().max() <= adam_tolerance(1e-4, 2), key


def test_simulate_accepts_nft_at_the_5b_recipes_world_size(repo):
    """128 simulated ranks' config checks; rank 0's shards, its old policy's bytes as the memory plan counts them,
    and one rollout and NFT step (the old policy swapped in under HSDP) on fake tensors."""
    argv = [str(Path(sys.executable).parent / "videogrpo"), "simulate", "--configfile", "config/recipes/rl_5b_cps.yaml"]
    argv += ["--set", *(f"grpo.{k}={str(v).lower()}" for k, v in NFT.items()), "--ranks", "0"]
    out = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "world 128" in out.stdout and "old policy 2.33 GiB = plan" in out.stdout
    assert "rollout + NFT at step 0" in out.stdout


def test_nft_costs_an_old_policy_forward_per_replay_and_a_copy_of_the_trained_shards(tiny_model):
    from videogrpo.grpo import flops
    from videogrpo.preflight import memory_plan, model_shape

    shape = model_shape.ModelShape.from_model_dir(tiny_model)
    plans = {}
    for g in ({}, NFT):
        cfg = config.from_dict(trainer_config(grpo=g))
        plans[cfg.grpo.algorithm] = {t.name: t.bytes for t in memory_plan.plan_for_config(cfg, shape).terms}
    assert "old policy" not in plans["grpo"]
    assert plans["nft"]["old policy"] * 2 == plans["nft"]["AdamW moments"]
    # train.ema_decay: one more copy of the trained shards, beside the old policy.
    cfg = config.from_dict(trainer_config(grpo=NFT, train={"ema_decay": 0.9}))
    both = {t.name: t.bytes for t in memory_plan.plan_for_config(cfg, shape).terms}
    assert both["EMA"] == both["old policy"] == plans["nft"]["old policy"]
    one = flops.ForwardFlops(1, 0, 0, 0, 0, 0, 0, 0)  # a forward of one FLOP
    args = (one, 1, 16, 4, 8, True, True, False, True)  # 16 samples x 4 steps replayed, 8 sampled, with guidance
    plain, with_old = flops.step_flops(*args), flops.step_flops(*args, old_policy=True)
    assert with_old.train == plain.train
    assert with_old.inference - plain.inference == 16 * 4 * 2


@pytest.mark.parametrize(
    "algorithm", [NFT, {"grpo_guard": True, "sampler": "dancegrpo", "eta": 0.3}], ids=["nft", "guard"]
)
def test_every_stage_loads_its_view_of_an_algorithm_run(algorithm):
    """A stage receives only the fields it reads (the report: the training sampler, not grpo.algorithm); a rule across
    fields must not refuse a view that lacks some of them."""
    from videogrpo.config.identity import STAGE_SECTIONS

    cfg = config.from_dict(trainer_config(grpo=algorithm))
    for stage in STAGE_SECTIONS:
        config.from_dict(config.stage_view(cfg, stage), partial=True)


def test_a_moving_average_that_never_blends_is_warned_about(tiny_model, dataset, tmp_path, capfd):
    """train.ema_every beyond the run's updates (known to the trainer even without train.max_steps): the log says
    ema/ holds the initial weights, and its training_state.json counts no blend."""
    cfg = solo_config(train={"max_steps": None, "epochs": 1, "save_steps": 100, "ema_decay": 0.9, "ema_every": 8})
    out = train_in_process(cfg, tmp_path, tiny_model, dataset)
    updates = len(metrics(out))
    assert 0 < updates < 7  # one epoch of the synthetic training split, a prompt an update
    assert "the moving average never blends, so ema/ will hold the initial weights" in capfd.readouterr().err
    assert json.loads((out / "ema/training_state.json").read_text())["ema"]["blends"] == 0
