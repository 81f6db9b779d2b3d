"""This project's DiffusionNFT (grpo.algorithm = nft) against its authors' own training code (NVlabs/DiffusionNFT,
scripts/train_nft_sd3.py), on the same tensors (README.md beside this file).

    python tools/algo_diff/diffusion_nft.py DIFFUSION_NFT [--commit C] [--store FILE]

DIFFUSION_NFT: a checkout of DiffusionNFT, its git directory (a clone or bare mirror), or a plain copy of its tree.
Their objective is written inline in the training loop, so the tool takes its lines from their file (from the
"# Policy Gradient Loss" comment to the total-loss line) and runs them on their own, in a namespace holding what the
loop would: the clean latents, the noised latents, the per-row noise level t, the advantages and the three
velocities (current, old, reference), with their config's values. Their `return_decay` and the old policy's update
at the end of an epoch are taken the same way. Compared, for beta 1 and 0.1 (their default and their multi-reward
configs):
- the loss (objective + KL to the reference at their weight 1e-4) and its gradient with respect to the velocity;
- one optimizer update of the velocity from that gradient (their AdamW and gradient clip beside this project's);
- the old policy's decay for each of their decay types over a range of update counts, and the old weights mixed.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from checkout import arguments, block_source, function_source, print_rows, read_source, relative_differences, store

TRAIN_FILE = "scripts/train_nft_sd3.py"
LOSS_FROM, LOSS_TO = "# Policy Gradient Loss", 'loss_terms["total_loss"] = loss.detach()'
MIX_FROM, MIX_TO = "decay = return_decay(global_step, config.decay_type)", "tgt_param.data.copy_("
SHAPE = (4, 4, 6, 6)  # [B, C, H, W]: an image latent; this project's video latent is [B, C, F, h, w] with F = 1
BETAS = (1.0, 0.1)
"""Their `config.beta` (the implicit policies' strength): 1.0 by default, 0.1 in their multi-reward and OCR configs."""
ADV_CLIP, KL_WEIGHT, LR, WEIGHT_DECAY, MAX_GRAD_NORM = 5.0, 1e-4, 3e-4, 1e-4, 1.0
DECAY_TYPES = {0: (0.0, 0.0, 0), 1: (0.001, 0.5, 0), 2: (0.0075, 0.999, 75)}
"""Their decay types as this project's (grpo.nft_old_decay_rate, _max, _after)."""
UPDATES = (0, 1, 2, 50, 74, 75, 76, 100, 208, 209, 210, 499, 500, 501, 1000)
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""


def inputs() -> dict:
    """Per row a clean latent, noise, a noise level (their SD3 10-step sigmas), an advantage (two beyond the clip),
    the three velocities; and a pair of weight lists for the old policy's mix (seeded)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    generator = torch.Generator().manual_seed(0)
    draw = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    return {
        "x0": draw(*SHAPE),
        "noise": draw(*SHAPE),
        "timesteps": scheduler.timesteps[[0, 3, 6, 9]].clone(),  # sigma x 1000, one per row (theirs differ per row)
        "advantages": torch.tensor([7.5, 1.3, -0.4, -6.0]),
        "velocity": draw(*SHAPE),
        "old_velocity": draw(*SHAPE),
        "reference_velocity": draw(*SHAPE),
        "new_weights": draw(3, 5),
        "old_weights": draw(3, 5),
    }


def _update(velocity: torch.Tensor, grad: torch.Tensor, optimizer) -> torch.Tensor:
    """One clipped optimizer step of a velocity treated as the parameters, from `grad`."""
    param = torch.nn.Parameter(velocity.clone())
    param.grad = grad.clone()
    opt = optimizer([param])
    torch.nn.utils.clip_grad_norm_([param], MAX_GRAD_NORM)
    opt.step()
    return param.detach()


def authors_side(text: str, data: dict) -> dict:
    """Their loss block, decay function and old-policy mix, run on `data`."""
    loss_block = compile(block_source(text, LOSS_FROM, LOSS_TO), TRAIN_FILE, "exec")
    decay_scope = {}
    exec(function_source(text, "return_decay"), decay_scope)
    out = {"loss": [], "grad": [], "updated": []}
    for beta in BETAS:
        v = data["velocity"].clone().requires_grad_(True)
        t = data["timesteps"] / 1000.0
        t_expanded = t.view(-1, *([1] * (data["x0"].ndim - 1)))
        scope = {
            "torch": torch,
            "config": SimpleNamespace(
                beta=beta, train=SimpleNamespace(adv_clip_max=ADV_CLIP, adv_mode="all", beta=KL_WEIGHT)
            ),
            "train_sample_batch": {"advantages": data["advantages"][:, None]},
            "j_idx": 0,
            "loss_terms": {},
            "x0": data["x0"],
            "t_expanded": t_expanded,
            "xt": (1 - t_expanded) * data["x0"] + t_expanded * data["noise"],
            "forward_prediction": v,
            "old_prediction": data["old_velocity"],
            "ref_forward_prediction": data["reference_velocity"],
        }
        exec(loss_block, scope)
        scope["loss"].backward()
        out["loss"].append(scope["loss"].detach())
        out["grad"].append(v.grad)
        adamw = lambda p: torch.optim.AdamW(p, lr=LR, betas=(0.9, 0.999), weight_decay=WEIGHT_DECAY, eps=1e-8)  # noqa: E731
        out["updated"].append(_update(data["velocity"], v.grad, adamw))
    out["decay"] = torch.tensor([[decay_scope["return_decay"](u, k) for u in UPDATES] for k in DECAY_TYPES])
    mixed = []
    for decay_type in DECAY_TYPES:
        targets = [w.clone() for w in data["old_weights"]]
        scope = {
            "torch": torch,
            "return_decay": decay_scope["return_decay"],
            "global_step": 100,
            "config": SimpleNamespace(decay_type=decay_type),
            "transformer_trainable_parameters": list(data["new_weights"]),
            "old_transformer_trainable_parameters": targets,
        }
        exec(compile(block_source(text, MIX_FROM, MIX_TO), TRAIN_FILE, "exec"), scope)
        mixed.append(torch.stack(targets))
    out["mixed"] = torch.stack(mixed)
    return {k: torch.stack(v) if isinstance(v, list) else v for k, v in out.items()}


def project_side(data: dict) -> dict:
    """This project's objective (grpo.nft), the trainer's KL term, its optimizer and gradient clip, and its
    old policy's decay and mix, on `data` (latents with one frame)."""
    from videogrpo.grpo import nft
    from videogrpo.grpo.host_optimizer import optimizer
    from videogrpo.grpo.samplers import masked_mean
    from videogrpo.grpo.weight_copy import WeightCopy

    frame = lambda x: x.unsqueeze(2)  # noqa: E731
    parallel = SimpleNamespace(offload_optimizer=False, offload_gradients=False)
    project_optimizer = lambda p: optimizer(p, LR, WEIGHT_DECAY, parallel)  # noqa: E731
    t = data["timesteps"] / 1000.0
    xt = torch.stack([nft.noised(frame(data["x0"])[i], float(t[i]), frame(data["noise"])[i]) for i in range(len(t))])
    out = {"loss": [], "grad": [], "updated": []}
    for beta in BETAS:
        v = frame(data["velocity"]).clone().requires_grad_(True)
        loss, *_ = nft.nft_objective(
            v, frame(data["old_velocity"]), xt, frame(data["x0"]), t, data["advantages"], beta, ADV_CLIP
        )
        loss = loss + KL_WEIGHT * masked_mean((v - frame(data["reference_velocity"])) ** 2, None).mean()
        loss.backward()
        out["loss"].append(loss.detach())
        out["grad"].append(v.grad.squeeze(2))
        out["updated"].append(_update(data["velocity"], v.grad.squeeze(2), project_optimizer))
    out["decay"] = torch.tensor([[nft.old_decay(u, *DECAY_TYPES[k]) for u in UPDATES] for k in DECAY_TYPES])
    mixed = []
    for decay_type in DECAY_TYPES:
        params = [torch.nn.Parameter(w.clone()) for w in data["new_weights"]]
        old = WeightCopy(params, [])
        for copy, w in zip(old.copies, data["old_weights"]):
            copy.copy_(w)
        old.mix(nft.old_decay(100, *DECAY_TYPES[decay_type]))
        mixed.append(torch.stack(old.copies))
    out["mixed"] = torch.stack(mixed)
    return {k: torch.stack(v) if isinstance(v, list) else v for k, v in out.items()}


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per compared output."""
    return relative_differences(theirs, ours, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "DiffusionNFT", argv)
    try:
        text, commit = read_source(args.checkout.resolve(), args.commit, TRAIN_FILE)
        data = inputs()
        theirs = authors_side(text, data)
    except OSError as err:
        print(f"diffusion_nft: could not run {TRAIN_FILE} of {args.checkout}: {err}", file=sys.stderr)
        return 2
    print(f"DiffusionNFT at {commit}: {TRAIN_FILE}, beta {BETAS}, decay types {sorted(DECAY_TYPES)}")
    ok = print_rows(compare(theirs, project_side(data)))
    store(args.store, {"commit": commit, "inputs": data, "theirs": theirs})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
