"""The `grpo` section of the config: the sampler, the group and its advantages, the objective and its options
(docs/options.md), and the replay's layout; one docstring per field (the schema's descriptions). Its own module so
that the sections stay legible; `config.sections` assembles it into the Config.

May import: the core modules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GRPOConfig:
    algorithm: str = "grpo"
    """The objective: `grpo`, the PPO-clipped GRPO on the sampler's log-probabilities (the reference); `nft`,
    DiffusionNFT (docs/options.md#diffusionnft): a forward-process objective that needs no log-probability."""
    sampler: str = "flowcps"
    """Rollout transition: `flowcps`, `dancegrpo` (RF-SDE), `flowgrpo` (its Wan ports' noise level sigma),
    `flowgrpo_sde` (Flow-GRPO's own sde step, noise level eta sqrt(sigma / (1 - sigma)): MixGRPO, GRPO-Guard), or
    `euler` (the deterministic Euler ODE) or `dpm_solver` (the deterministic DPM-Solver++ (2M), DiffusionNFT's): the
    last two for grpo.algorithm nft only, which trains without log-probabilities."""
    eta: float = 0.7
    """Noise level of the sampler (Flow-CPS 0.7, DanceGRPO 0.3, flowgrpo_sde 0.7)."""
    eta_range: list[float] | None = None
    """Draw one eta per prompt uniformly from [lo, hi] (grpo_cps_noise_scale_range); null: fixed eta."""
    sampling_steps: int = 30
    """Denoising steps per rollout (T)."""
    shift: float | None = None
    """Flow-matching time shift of the sigma schedule; null: the model's (its scheduler_config.json's
    flow_shift, else shift, else 5.0, as the reference), a number overrides it (preflight says which)."""
    guidance_scale: float = 1.0
    """Classifier-free guidance scale (1.0: no unconditional pass)."""
    group_size: int = 32
    """Rollouts per prompt (G)."""
    prompts_per_step: int = 32
    """Prompts per optimizer step, over all ranks."""
    shared_prompts: bool = True
    """Shared-prompt mode: the ranks of a wave split each prompt's group between them."""
    prompts_per_wave: int | None = None
    """Prompts rolled out at once in shared-prompt mode (grpo_shared_prompt_microbatch_size); null: all."""
    sample_batch_size: int | None = None
    """Group members of each of this rank's prompts per rollout forward (grpo_sample_batch_size); null: the whole
    wave at once. Replay still runs one backward per wave and timestep, so updates do not depend on it."""
    decode_batch_size: int | None = 8
    """Rollouts the VAE decodes at once for scoring (8 rule, 4 judge recipes); null or 0: the whole wave."""
    vae_tile_size: int | None = None
    """Decode rollouts in overlapping square tiles of this many pixels a side, blended (diffusers' VAE tiling, stride
    3/4 of a tile): the decoder's memory then follows the tile, not the frame. A multiple of 4 x the VAE's spatial
    factor (64 TI2V, 32 I2V-A14B); it changes the decoded pixels, so a new run. null: whole frames (the reference)."""
    timestep_fraction: float = 0.6
    """Fraction of the first T - 1 timesteps trained per update (not used with an SDE window: it trains its steps)."""
    grpo_guard: bool = False
    """GRPO-Guard (docs/options.md#grpo-guard): each replayed step's log-ratio normalised by its transition std (the
    mean-shift term added back), and the step's loss divided by sigma - sigma'; Gaussian samplers (dancegrpo,
    flowgrpo, flowgrpo_sde) only. Off: the reference's ratio."""
    grpo_guard_scope: str = "micro_batch"
    """What GRPO-Guard's mean-shift term and std are taken over: `micro_batch`, the rows of one replay forward (its
    authors' code: their mean over the micro-batch), or `row`, each row's own (their paper's derivation)."""
    sde_window_size: int = 0
    """SDE window (docs/options.md#sde-window): sample with the SDE on this many consecutive denoising steps and with
    the Euler ODE elsewhere, and train only those steps; 0: off, SDE on every step (the reference)."""
    sde_window_range: list[int] | None = None
    """The steps [lo, hi) the window may cover; null: every denoising step."""
    sde_window_mode: str = "random"
    """`random`: a start drawn per batch, uniform over the range (Flow-GRPO-Fast); `sliding`: from lo, moved by
    sde_window_stride every sde_window_shift_every batches, back to lo past the range (MixGRPO)."""
    sde_window_stride: int = 1
    """Steps a sliding window moves at a time."""
    sde_window_shift_every: int = 25
    """Batches between a sliding window's moves."""
    sde_window_tail: str = "euler"
    """The ODE after the window: `euler`, the Euler step on every remaining step; `dpm_solver`, MixGRPO-Flash's
    tail: the remaining steps re-spaced to fewer (sde_window_tail_ratio) and taken by DPM-Solver++ (2M)."""
    sde_window_tail_ratio: float = 0.4
    """dpm_solver: the tail's noise levels are int(max(ratio x (T - end + 1), 1)) from the window's end down to 0
    (MixGRPO-Flash 0.4, Flash* 0.2); one alone ends the sample at the window's end, as their code does."""
    nft_beta: float = 1.0
    """DiffusionNFT's strength: its implicit policies are v_old +- nft_beta (v - v_old)."""
    nft_adv_clip: float = 5.0
    """DiffusionNFT's advantage clip c: r = 0.5 + clip(A, +-c) / (2c), and the loss is scaled by c."""
    nft_old_decay_rate: float = 0.001
    """DiffusionNFT's old policy, old <- d old + (1 - d) new after each update, has d = min(nft_old_decay_rate x
    (update - nft_old_decay_after), nft_old_decay_max), 0 before nft_old_decay_after (on-policy)."""
    nft_old_decay_max: float = 0.5
    """The old policy's largest decay d, in [0, 1)."""
    nft_old_decay_after: int = 0
    """Updates before the old policy starts to lag (d = 0 until then)."""
    clip_range: float = 1e-4
    """PPO clip range on-policy (grpo_clip_range)."""
    delayed_replay: bool = True
    """One-step-delayed replay: roll out the next batch while the previous one's rewards finish."""
    delayed_clip_range: float = 1e-2
    """PPO clip range under delayed replay."""
    kl_coeff: float = 0.0
    """Weight of the KL to the frozen reference policy."""
    share_group_noise: bool = True
    """All members of a group start from one initial noise (dancegrpo_share_group_init_noise)."""
    trajectory_dtype: str = "compute"
    """Dtype of the stored rollout latents and of the timestep fed to the transformer: `compute`
    (parallel.param_dtype: bf16 in the recipes, as the reference), `float32` or `bfloat16`."""
    shuffle_advantages: bool = False
    """Placebo control: permute each group's advantages among its members (seeded), keeping the reward
    statistics and destroying the credit assignment; a real gain must beat this run's."""
    clip_range_high: float | None = None
    """Upper clip range of the PPO ratio (the ratio is clipped to [1 - c, 1 + clip_range_high], c the active clip
    range: delayed_clip_range under delayed replay, else clip_range); null: symmetric, as the reference."""
    updates_per_batch: int = 1
    """Optimizer updates per pass over a rollout batch (PPO's inner loop): the batch's rows split into this many
    equal sets (update_order), one update each. Every update's ratio is taken against the rollout's
    log-probabilities, so only the first is on-policy. 1: one update per batch, as the reference."""
    update_passes: int = 1
    """Passes over a rollout batch, each of updates_per_batch updates (the authors' num_inner_epochs)."""
    update_order: str = "shuffled"
    """How a pass splits the batch's rows: `shuffled`, a seeded permutation of every prompt's members, keyed by the
    batch and the pass; `by_member`, update m takes members [m G / U, (m + 1) G / U) of every prompt (MixGRPO)."""
    advantage_std: str = "group"
    """The std that scales a rollout's advantage (r - its group's mean): `group`, its group's, as the reference;
    `batch`, one over every reward of the batch (Flow-GRPO-Fast's and DiffusionNFT's global std)."""
    advantage_std_unbiased: bool = True
    """The std with n - 1 (the reference's, MixGRPO's); false: the population std (Flow-GRPO's, GRPO-Guard's,
    DiffusionNFT's)."""
    advantage_eps: float = 1e-4
    """Added to the std before dividing (the reference 1e-4; MixGRPO 1e-8)."""
    drop_zero_advantage: bool = False
    """Rollouts whose advantage is exactly 0 leave the loss and are not replayed; where the kept count is not a
    multiple of updates_per_batch, seeded zero-advantage rollouts are put back until it is (Flow-GRPO-Fast's and
    GRPO-Guard's filter). The metric `dropped_rollouts` counts them."""
    skip_zero_variance_groups: bool = False
    """A group whose rewards are all equal contributes no loss (its rollouts are replayed still, left out of the
    mean) and is counted in the `zero_variance_groups` metric; false: kept with zero advantages, as the reference
    (docs/options.md)."""
