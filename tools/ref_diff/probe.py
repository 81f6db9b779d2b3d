"""Probes of the reference's own model, sampler and loss functions on the tiny models (CPU, float32, no trainer):
(a) a rollout by its `sde_generate`, (b) a replayed transition's log-probability against the rollout's (on
policy: equal), (c) a clipped GRPO loss and its gradient, and (d) for the two-expert model, which expert serves
each step. A failure here means the reference does not run in the environment the tool built for it.
"""

from __future__ import annotations

import time

import torch
from common import WORK
from reference_patches import NoiseQueue, import_reference


def probe(model_dir, label: str, G: int = 4, T: int = 4) -> None:
    from src.models.wan_i2v import WanI2VForTraining

    torch.manual_seed(0)
    t0 = time.time()
    model = WanI2VForTraining(
        str(model_dir),
        lora_config=None,
        train_experts="both",
        gradient_checkpointing=False,
        load_vae=False,
        load_text_encoder=False,
        transformer_dtype=torch.float32,
    )
    load = time.time() - t0
    a14b = model.transformer_2 is not None
    C, F, H, W = (16, 3, 8, 8) if a14b else (48, 3, 4, 4)
    L, D = 16, 32
    if a14b:
        cond = torch.cat([torch.zeros(1, 4, F, H, W), torch.randn(1, C, F, H, W)], dim=1)
        cond[:, :, 0] = 1.0
    else:
        cond = torch.randn(1, C, 1, H, W).expand(1, C, F, H, W).contiguous()
    cond = cond.to(torch.bfloat16).repeat_interleave(G, 0)
    embeds = torch.randn(1, L, D).repeat_interleave(G, 0)
    x_t = torch.randn(1, C, F, H, W).repeat_interleave(G, 0)
    q = NoiseQueue({"bfloat16": torch.float32})
    q.push(*[torch.randn(G, C, F, H, W) for _ in range(T)])
    t0 = time.time()
    with q:
        traj = model.sde_generate(
            condition=cond,
            prompt_embeds=embeds,
            num_sampling_steps=T,
            sde_noise_scale=0.3,
            initial_latent=x_t,
            sde_formula="dancegrpo",
        )
    print(
        f"(a) {label}: loaded in {load:.1f}s, rollout of {T} steps in {time.time() - t0:.2f}s; timesteps",
        [round(t, 1) for t in traj["timesteps"]],
    )
    tr, i = model.transformer, 1
    latent, nxt = traj["latents"][i], traj["latents"][i + 1]
    sigma, sigma_prev = traj["sigmas"][i].item(), traj["sigmas"][i + 1].item()
    with q:
        transformer = model._get_expert_for_timestep(traj["timesteps"][i])
        ts = torch.tensor([traj["timesteps"][i]]).expand(G)
        hs, ti, ehs = model._prepare_transformer_call(
            transformer,
            model._build_model_input(latent, cond),
            model._build_timestep_input(ts, latent, transformer),
            embeds,
        )
        out = transformer(hidden_states=hs, timestep=ti, encoder_hidden_states=ehs, return_dict=False)[0]
        mean, std = model._sde_transition_mean(
            latent, out, sigma, sigma_prev, sde_formula="dancegrpo", sde_noise_scale=0.3
        )
        lp = model._sde_transition_log_prob("dancegrpo", nxt, mean, std, skip_first_frame=model.expand_timesteps)
    print(f"(b) {label}: replayed log-p - rollout log-p, max |d| {(lp - traj['log_probs'][i]).abs().max().item():.1e}")
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    ratio = torch.exp(lp - traj["log_probs"][i])
    loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - 1e-3, 1 + 1e-3)).mean()
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in transformer.parameters() if p.grad is not None))
    print(f"(c) {label}: loss {loss.item():+.3e}, grad norm {norm.item():.6e}")
    if a14b:
        names = [
            "transformer" if model._get_expert_for_timestep(t) is tr else "transformer_2" for t in traj["timesteps"]
        ]
        print(f"(d) {label}: boundary {model.boundary_timestep}, experts per step {names}")


def main() -> None:
    import_reference()
    probe(WORK / "tiny", "tiny TI2V")
    probe(WORK / "tiny_i2v", "tiny I2V-A14B")
