"""This project's GRPO-Guard (grpo.grpo_guard) against its authors' own training code (Flow-GRPO's repository,
scripts/train_sd3_GRPO_Guard.py), on the same tensors (README.md beside this file).

    python tools/algo_diff/grpo_guard.py FLOW_GRPO [--commit C] [--store FILE]

FLOW_GRPO: a checkout of flow_grpo holding GRPO-Guard, its git directory (a clone or bare mirror), or a plain copy of
its tree. Their normalised ratio and loss are written inline in the training loop, so the tool takes the lines from
the "# grpo logic" comment to the loss's reweighting out of their file and runs them on their own, in a namespace
holding what the loop would: their SDE step's log-probability, transition mean, std and sqrt(-dt) (from their own
`sde_step_with_logprob`, which the tool loads too) for a rollout's old velocity and a moved current one, the stored
old log-probabilities and means, and the advantages. At four noise levels of a 10-step schedule it compares:
- the normalised ratio, the loss (reweighted by 1 / (sigma - sigma')) and its gradient with respect to the velocity;
- one optimizer update of the velocity from that gradient (AdamW with gradient clipping, the same on both sides);
each for their code on a micro-batch of four rows against grpo.grpo_guard_scope micro_batch over the same four rows
(their mean-shift term and std are the micro-batch's), for their code on micro-batches of one row against the
scope `row` (each row's own, as their paper derives it), and, as `off`, for the plain ratio and PPO loss of
Flow-GRPO-Fast's script (scripts/train_sd3_fast.py, what an SDE window's steps train on) against this project's
with GRPO-Guard off, at their default clip range 1e-4.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from checkout import arguments, block_source, print_rows, read_source, relative_differences, store
from flow_grpo_steps import load_step_function

TRAIN_FILE = "scripts/train_sd3_GRPO_Guard.py"
FAST_FILE = "scripts/train_sd3_fast.py"
"""Flow-GRPO-Fast's training script (the SDE window's): its plain PPO loss, what grpo.grpo_guard off replays."""
BLOCK_FROM = "# grpo logic"
BLOCK_TO = {TRAIN_FILE: "policy_loss = policy_loss / (sqrt_dt.mean()**2)", FAST_FILE: "policy_loss = torch.mean("}
STEPS, SHIFT, NOISE = 10, 3.0, 0.7
INDICES = (0, 3, 6, 8)
"""The schedule's steps compared (their SDE's std vanishes at the last)."""
SHAPE = (4, 4, 6, 6)  # [B, C, H, W]: an image latent; this project's video latent is [B, C, F, h, w] with F = 1
CLIP_RANGE, ADV_CLIP, LR, WEIGHT_DECAY, MAX_GRAD_NORM, ADAM_EPS = 2e-6, 5.0, 3e-4, 1e-4, 1.0, 1e-8
"""Their GRPO-Guard config's clip range; their other training values."""
PLAIN_CLIP = 1e-4
"""Their default clip range, for the plain ratio."""
SCOPES = {"micro_batch": (TRAIN_FILE, SHAPE[0]), "row": (TRAIN_FILE, 1), "off": (FAST_FILE, SHAPE[0])}
"""Each grpo.grpo_guard_scope (`off`: grpo.grpo_guard false), the script whose loss lines are run for it and the rows
of their micro-batches."""
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""


def _scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    scheduler.set_timesteps(STEPS)
    return scheduler


def inputs() -> dict:
    """Per compared step: latents, the rollout's velocity, a current velocity moved from it by a different amount per
    row (so the rows' mean shifts differ), the rollout's noise and the advantages (seeded)."""
    scheduler = _scheduler()
    generator = torch.Generator().manual_seed(0)
    draw = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    n = len(INDICES)
    old = draw(n, *SHAPE)
    moved = torch.tensor([0.0, 0.01, 0.03, 0.1]).view(1, -1, 1, 1, 1) * draw(n, *SHAPE)
    return {
        "sigmas": scheduler.sigmas.clone(),
        "timesteps": scheduler.timesteps.clone(),
        "latents": draw(n, *SHAPE),
        "old_velocity": old,
        "velocity": old + moved,
        "noise": draw(n, *SHAPE),
        "advantages": torch.tensor([1.2, -0.7, 0.4, -1.5]),
    }


def _their_step(step_function, data: dict, k: int, rows: slice, velocity: torch.Tensor) -> tuple:
    """Their step at compared step k for `rows`: the rollout's (next latent from the stored noise, log p, mean) under
    the old velocity, then log p, mean, std and sqrt(-dt) of that next latent under `velocity`."""
    t = data["timesteps"][INDICES[k]].repeat(SHAPE[0])[rows]
    x = data["latents"][k][rows]
    old_velocity = data["old_velocity"][k][rows]
    _, _, old_mean, std_dev_t, sqrt_dt = step_function(
        _scheduler(), old_velocity, t, x, NOISE, prev_sample=x, sde_type="sde", return_sqrt_dt=True
    )
    old_next = old_mean + std_dev_t * sqrt_dt * data["noise"][k][rows]
    _, old_logp, _, _ = step_function(_scheduler(), old_velocity, t, x, NOISE, prev_sample=old_next, sde_type="sde")
    _, logp, mean, std_dev_t, sqrt_dt = step_function(
        _scheduler(), velocity, t, x, NOISE, prev_sample=old_next, sde_type="sde", return_sqrt_dt=True
    )
    return old_next, old_logp, old_mean, logp, mean, std_dev_t, sqrt_dt


def authors_side(texts: dict[str, str], step_function, data: dict, scope: str) -> dict:
    """Their loss block of `scope` on their step's tensors, per step and micro-batch: the ratio, the loss averaged
    over the micro-batches, its gradient to the velocity, and the velocity after one AdamW step."""
    path, rows_per_batch = SCOPES[scope]
    block = compile(block_source(texts[path], BLOCK_FROM, BLOCK_TO[path]), path, "exec")
    clip = PLAIN_CLIP if scope == "off" else CLIP_RANGE
    config = SimpleNamespace(rationorm=True, train=SimpleNamespace(adv_clip_max=ADV_CLIP, clip_range=clip))
    out = {k: [] for k in ("ratio", "loss", "grad", "updated")}
    for k in range(len(INDICES)):
        velocity = data["velocity"][k].clone().requires_grad_(True)
        ratios, total = [], 0.0
        for start in range(0, SHAPE[0], rows_per_batch):
            rows = slice(start, start + rows_per_batch)
            _, old_logp, old_mean, logp, mean, std_dev_t, sqrt_dt = _their_step(
                step_function, data, k, rows, velocity[rows]
            )
            sample = {
                "advantages": data["advantages"][rows, None],
                "log_probs": old_logp[:, None],
                "prev_sample_mean": old_mean[:, None],
            }
            scope = dict(torch=torch, config=config, sample=sample, j=0, log_prob=logp, prev_sample_mean=mean,
                         std_dev_t=std_dev_t, sqrt_dt=sqrt_dt)  # fmt: skip
            exec(block, scope)
            ratios.append(scope["ratio"].detach().flatten())
            total = total + scope["policy_loss"] * (rows.stop - rows.start) / SHAPE[0]
        total.backward()
        out["ratio"].append(torch.cat(ratios))
        out["loss"].append(total.detach())
        out["grad"].append(velocity.grad.clone())
        out["updated"].append(_one_update(velocity))
    return {k: torch.stack(v) for k, v in out.items()}


def _one_update(velocity: torch.Tensor) -> torch.Tensor:
    optimizer = torch.optim.AdamW([velocity], lr=LR, weight_decay=WEIGHT_DECAY, eps=ADAM_EPS)
    torch.nn.utils.clip_grad_norm_([velocity], MAX_GRAD_NORM)
    optimizer.step()
    return velocity.detach().clone()


def project_side(data: dict, stepped: dict, scope: str) -> dict:
    """This project's guard_log_ratio, PPO loss and reweighting of grpo.grpo_guard_scope `scope` on the same Gaussian
    steps (`stepped`: per step, the rollout's next latent, old mean and std, and the current mean as a function of the
    velocity); `off`: the plain ratio and PPO loss (grpo.grpo_guard false)."""
    from videogrpo.grpo import loss as guard
    from videogrpo.grpo import samplers

    out = {k: [] for k in ("ratio", "loss", "grad", "updated")}
    for k, index in enumerate(INDICES):
        velocity = data["velocity"][k].clone().requires_grad_(True)
        old_next, old_mean = (stepped[name][k].unsqueeze(2) for name in ("next", "old_mean"))  # F = 1
        std = stepped["std"][k]
        mean = stepped["mean_of"](k, velocity).unsqueeze(2)
        old_logp = samplers.log_prob("dancegrpo", old_next, old_mean, std)
        logp = samplers.log_prob("dancegrpo", old_next, mean, std)
        advantages = torch.clamp(data["advantages"], -ADV_CLIP, ADV_CLIP)
        if scope == "off":
            log_ratio = logp - old_logp
            loss, _ = guard.ppo_loss(logp, old_logp, advantages, PLAIN_CLIP)
        else:
            log_ratio = guard.guard_log_ratio(logp, old_logp, mean, old_mean, std, per_row=scope == "row")
            loss, _ = guard.ppo_loss(log_ratio, torch.zeros_like(log_ratio), advantages, CLIP_RANGE)
            loss = loss / float(data["sigmas"][index] - data["sigmas"][index + 1])
        loss.backward()
        out["ratio"].append(torch.exp(log_ratio).detach())
        out["loss"].append(loss.detach())
        out["grad"].append(velocity.grad.clone())
        out["updated"].append(_one_update(velocity))
    return {k: torch.stack(v) for k, v in out.items()}


def gaussian_steps(step_function, data: dict) -> dict:
    """Their SDE step's Gaussian per compared step (the tensors this project's side reads)."""
    steps = {"next": [], "old_mean": [], "std": []}
    for k in range(len(INDICES)):
        old_next, _, old_mean, _, _, std_dev_t, sqrt_dt = _their_step(
            step_function, data, k, slice(None), data["velocity"][k]
        )
        steps["next"].append(old_next)
        steps["old_mean"].append(old_mean)
        steps["std"].append((std_dev_t * sqrt_dt).flatten().expand(SHAPE[0]).clone())
    stored = {name: torch.stack(v) for name, v in steps.items()}
    # The mean is affine in the velocity: stored as its two coefficients, so the stored file needs no their code.
    zero = torch.zeros(SHAPE)
    stored["mean_at_zero"] = torch.stack(
        [_their_step(step_function, data, k, slice(None), zero)[4] for k in range(len(INDICES))]
    )
    stored["mean_per_velocity"] = (
        torch.stack(
            [_their_step(step_function, data, k, slice(None), torch.ones(SHAPE))[4] for k in range(len(INDICES))]
        )
        - stored["mean_at_zero"]
    )
    return stored


def with_mean(stepped: dict) -> dict:
    """`stepped` with `mean_of(k, velocity)`: their transition mean, affine in the velocity."""
    return dict(stepped, mean_of=lambda k, v: stepped["mean_at_zero"][k] + stepped["mean_per_velocity"][k] * v)


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per compared output. The
    update's difference is taken net of what AdamW makes of the gradients' round-off: its first step is
    lr g / (|g| + eps), so a gradient element of 6e-10 on one side and 0 on the other (seen) moves the weight by
    2e-5; each element is allowed lr |g - g'| / eps beyond round-off."""
    amplified = LR * (ours["grad"] - theirs["grad"]).abs() / ADAM_EPS
    net = dict(
        ours, updated=theirs["updated"] + torch.clamp((ours["updated"] - theirs["updated"]).abs() - amplified, min=0)
    )
    return relative_differences(theirs, net, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "flow_grpo", argv)
    try:
        texts = {}
        for path in (TRAIN_FILE, FAST_FILE):
            texts[path], commit = read_source(args.checkout.resolve(), args.commit, path)
        step_function, _ = load_step_function(args.checkout.resolve(), commit)
    except OSError as err:
        print(f"grpo_guard: could not read {TRAIN_FILE} of {args.checkout}: {err}", file=sys.stderr)
        return 2
    data = inputs()
    stepped = gaussian_steps(step_function, data)
    theirs = {scope: authors_side(texts, step_function, data, scope) for scope in SCOPES}
    print(f"flow_grpo at {commit}: {TRAIN_FILE} and {FAST_FILE}, steps {INDICES} of {STEPS}")
    ok = True
    for scope, (path, rows) in SCOPES.items():
        print(f"  grpo.grpo_guard_scope {scope} against {path} on micro-batches of {rows} row(s):")
        ours = project_side(data, with_mean(stepped), scope)
        ok &= print_rows(compare(theirs[scope], ours), indent="    ")
    store(args.store, {"commit": commit, "inputs": data, "stepped": stepped, "theirs": theirs})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
