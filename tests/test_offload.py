"""The memory plan of docs/reference-system.md#memory on CPU: frozen models offloaded between uses, trajectories
parked on
CPU, rollout and decoding in chunks, a byte-bounded prompt cache on CPU, bf16 frozen weights, no reference model
at KL weight 0.

On CPU the compute device and the host are both `cpu`, so where a module is cannot be read off its tensors:
the schedule's books (`offload.Placement.where`) can, and forward pre-hooks record them, with the module's
own parameter device and dtype and every `module.to` call, at the moment each module runs. The records are
checked against the reference's plan as written here, independently of `offload.plan`; mutated
schedules show that a forgotten move fails.
"""

from __future__ import annotations

import pytest
import torch

from videogrpo.data.dataset import batch_for_step
from videogrpo.grpo import offload
from videogrpo.grpo.rollout import Trajectory
from videogrpo.models.prompt_cache import PromptCache
from videogrpo.models.wan import clean_prompt

from harness import metrics, solo_config, tensors, trainer_in_process, weights, without_times

# Two prompts of 4 members in one wave (replica mode), so that chunks of members cut across prompts.
TWO_PROMPTS = dict(
    grpo={"prompts_per_step": 2, "shared_prompts": False},
    train={"batch_size": 2, "max_steps": 2, "save_steps": 1000},
)


def options(**sections) -> dict:
    cfg = solo_config(**TWO_PROMPTS)
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


def run(cfg: dict, out, tiny_model, dataset):
    trainer = trainer_in_process(cfg, out, tiny_model, dataset)
    trainer.run()
    return trainer


@pytest.fixture(scope="module")
def plain(tiny_model, dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("plain")
    trainer = run(options(), out, tiny_model, dataset)
    assert trainer.placement.moves == []  # without offload nothing ever moves
    return out


REWARDS = ("reward_mean", "reward_std", "reward_std_within_group", "advantage_mean", "reward_per_task", "step")


def same_rollouts_and_close_updates(out, plain, lr: float = 1e-4) -> None:
    """The first batch's rollouts, rewards and advantages byte-identical; the replay, which backpropagates chunk
    by chunk where the rollout was chunked (the reference's one backward per chunk), sums its gradients in
    another order, so the losses, the weights, and with them the later rollouts agree to round-off (AdamW: up
    to a tenth of lr per update, harness.adam_tolerance)."""
    first, *_ = zip(metrics(out), metrics(plain), strict=True)
    assert {k: first[0][k] for k in REWARDS} == {k: first[1][k] for k in REWARDS}
    for a, b in zip(metrics(out), metrics(plain), strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-4)
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], rel=1e-4, abs=1e-6)  # near 0 at ratio 1
    a, b = tensors(out), tensors(plain)
    updates = len(metrics(plain))
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 0.1 * lr * updates


@pytest.mark.parametrize(
    "sample_batch_size, decode_batch_size", [(None, None), (2, 2), (3, 4)], ids=["whole", "2-2", "3-4"]
)
def test_offload_and_chunk_sizes_change_no_rollout(
    plain, tiny_model, dataset, tmp_path, sample_batch_size, decode_batch_size
):
    """Offloaded, in rollout chunks of 2 or 3 members (3 leaves a last chunk of one member per prompt: uneven
    chunks) and decoding 2 or 4 at a time: the same rollouts and rewards, byte for byte, as the plain run; the
    whole wave at once is the plain run byte for byte; replay forwards take the rollout's chunks."""
    cfg = options(
        train={"offload_inference_models": True},
        grpo={"sample_batch_size": sample_batch_size, "decode_batch_size": decode_batch_size},
    )
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset)
    replay_rows = []
    trainer.experts.policy.register_forward_pre_hook(
        lambda m, args, kwargs: replay_rows.append(len(kwargs["hidden_states"])) if torch.is_grad_enabled() else None,
        with_kwargs=True,
    )
    trainer.run()
    assert any(what == "trajectory" for _, what, _ in trainer.placement.moves)  # it did offload
    chunk_rows = {None: [8], 2: [4, 4], 3: [6, 2]}[sample_batch_size]  # 2 prompts x (members per chunk)
    assert replay_rows == chunk_rows * (len(replay_rows) // len(chunk_rows)) and replay_rows
    if sample_batch_size is None:
        assert weights(tmp_path) == weights(plain)
        assert without_times(metrics(tmp_path)) == without_times(metrics(plain))
    else:
        same_rollouts_and_close_updates(tmp_path, plain)


def test_offloaded_delayed_replay_over_waves_changes_no_rollout(tiny_model, dataset, tmp_path):
    """Two waves per batch under delayed replay (the next batch rolls out before the previous one replays),
    offloaded, in chunks of 2 members, decoded 2 at a time: the rollouts of the same run without any of it."""
    delayed = dict(shared_prompts=True, prompts_per_wave=1, delayed_replay=True)
    run(options(grpo=delayed), tmp_path / "plain", tiny_model, dataset)
    cfg = options(
        grpo=dict(delayed, sample_batch_size=2, decode_batch_size=2), train={"offload_inference_models": True}
    )
    run(cfg, tmp_path / "offloaded", tiny_model, dataset)
    same_rollouts_and_close_updates(tmp_path / "offloaded", tmp_path / "plain")
    assert {m["delayed_replay_staleness"] for m in metrics(tmp_path / "plain")} == {1.0, 0.0}


def test_a_forward_of_one_row_differs_by_float_rounding_only(tiny_model, dataset, tmp_path):
    """Chunks of one row (one prompt, one member per forward, one video per decode) against the whole wave: on
    CPU oneDNN convolves a batch of one by another algorithm (the patch embedding, the VAE), seen 1e-6 in the
    velocity, so this is the one chunking that is not byte-identical here."""
    one = dict(train={"max_steps": 2, "save_steps": 1000})
    whole = run(solo_config(**one), tmp_path / "whole", tiny_model, dataset)
    single = solo_config(**one)
    single["grpo"].update(sample_batch_size=1, decode_batch_size=1)
    single["train"]["offload_inference_models"] = True
    run(single, tmp_path / "single", tiny_model, dataset)
    assert whole.placement.moves == []
    for a, b in zip(metrics(tmp_path / "single"), metrics(tmp_path / "whole"), strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-3)
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-4)
    from safetensors.torch import load_file

    initial = load_file(tiny_model / "transformer/diffusion_pytorch_model.safetensors")
    ta, tb = tensors(tmp_path / "single"), tensors(tmp_path / "whole")
    # The rewards move by rounding, so the advantages and AdamW's normalised steps do a little: compare the updates.
    apart = sum(float((ta[k] - tb[k]).double().square().sum()) for k in ta) ** 0.5
    moved = sum(float((tb[k] - initial[k]).double().square().sum()) for k in ta) ** 0.5
    print(f"one-row chunks: the updates differ by {apart / moved:.2e} of their size")
    assert 0 < apart < 2e-2 * moved


# ---- where every module is when it runs ---------------------------------------------------------------------

# The reference's plan (docs/reference-system.md#memory), written out here and not read from offload.plan: per phase,
# where the text encoder and the VAE must be when something runs in it ("*": either).
REFERENCE_PLAN = {
    "encode": {"text_encoder": "compute", "vae": "compute"},
    "rollout": {"text_encoder": "host", "vae": "*"},
    "decode": {"text_encoder": "host", "vae": "compute"},
    "replay": {"text_encoder": "host", "vae": "host"},
}
RUNS_IN = {"text_encoder": "encode", "vae.encoder": "encode", "vae.decoder": "decode"}


def instrument(trainer) -> list[dict]:
    """Forward pre-hooks on the text encoder, the VAE's encoder and decoder and the trainable transformer, and a
    spy on every `.to` of the frozen models: what ran, in which phase, on which device and dtype its parameters
    really were, where the schedule's books had every frozen model, and how many moves the books held."""
    records: list[dict] = []
    books = trainer.placement

    def recorder(name: str, module):
        def hook(mod, args, kwargs=None):
            param = next(module.parameters())
            records.append(
                {
                    "module": name,
                    "grad": torch.is_grad_enabled(),
                    "phase": books.phase,
                    "device": param.device,
                    "dtype": param.dtype,
                    "where": dict(books.where),
                    "moves": len(books.moves),
                }
            )

        return hook

    model = trainer.model
    parts = {"text_encoder": model.text_encoder, "vae.encoder": model.vae.encoder, "vae.decoder": model.vae.decoder}
    for name, part in parts.items():
        part.register_forward_pre_hook(recorder(name, part))
    trainer.experts.policy.register_forward_pre_hook(recorder("transformer", trainer.experts.policy))
    for name, module in (("text_encoder", model.text_encoder), ("vae", model.vae)):
        real = module.to

        def spy(*args, _name=name, _real=real, **kwargs):
            records.append({"module": _name, "to": torch.device(args[0]), "phase": books.phase})
            return _real(*args, **kwargs)

        module.to = spy
    return records


def check_against_the_reference_plan(records: list[dict], books: offload.Placement) -> dict:
    """Every forward ran where the reference's plan puts each frozen model, its parameters where the books say,
    the allocator cache emptied after the last decode and before each replay forward, each replayed transition
    fetched, and every `.to` call one move in the books. Returns counts of what ran."""
    moves = books.moves
    seen: dict[str, int] = {}
    last_decode_moves = 0
    to_calls = [r for r in records if "to" in r]
    for r in records:
        if "to" in r:
            continue
        name = r["module"]
        phase = (
            "replay" if name == "transformer" and r["grad"] else "rollout" if name == "transformer" else RUNS_IN[name]
        )
        key = f"{name}:{phase}"
        seen[key] = seen.get(key, 0) + 1
        assert r["phase"] == phase, r
        for frozen, wanted in REFERENCE_PLAN[phase].items():
            found = r["where"][frozen]
            assert wanted in ("*", found), (frozen, found, r)
        owner = name.split(".")[0]
        if owner in r["where"]:  # a frozen model runs on the compute device, by the books and by its tensors
            assert r["where"][owner] == "compute" and r["device"] == books.compute, r
        if phase == "decode":
            last_decode_moves = r["moves"]
        if phase == "replay":
            since = moves[last_decode_moves : r["moves"]]
            assert ("replay", "allocator cache emptied", "compute") in since, since  # after the last decode
            assert moves[r["moves"] - 1][1] == "transition", moves[: r["moves"]]  # its transition fetched just before
    emptied = [i for i, (_, what, _) in enumerate(moves) if what == "allocator cache emptied"]
    model_moves = [m for m in moves if m[1] in ("text_encoder", "vae")]
    # Every move in the books is a real .to, to the device of its kind.
    assert [(r["phase"], r["module"], r["to"]) for r in to_calls] == [
        (p, m, books.device(k)) for p, m, k in model_moves
    ]
    seen["cache emptied"] = len(emptied)
    seen["parked"] = sum(what == "trajectory" for _, what, _ in moves)
    return seen


def offloaded(**grpo) -> dict:
    return options(
        train={"offload_inference_models": True}, grpo={"sample_batch_size": 2, "decode_batch_size": 4, **grpo}
    )


# Two prompts of one wave in two rollout chunks each, two synchronous updates; or two waves of one prompt per
# batch under delayed replay (a batch rolls out before the previous one replays; the flush replays the last).
SCHEDULES = {
    "chunks": (lambda: offloaded(), {"waves": 2, "chunks": 4, "vae": [("encode", "vae"), ("replay", "vae")] * 2}),
    "delayed-waves": (
        lambda: offloaded(
            shared_prompts=True, prompts_per_wave=1, delayed_replay=True, decode_batch_size=3
        ),  # 4 videos per wave: decoded 3 + 1
        {"waves": 4, "chunks": 8, "vae": [("encode", "vae"), ("replay", "vae")]},
    ),
}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_module_runs_where_the_schedule_says(tiny_model, dataset, tmp_path, schedule):
    make, expected = SCHEDULES[schedule]
    trainer = trainer_in_process(make(), tmp_path, tiny_model, dataset)
    records = instrument(trainer)
    trainer.run()
    seen = check_against_the_reference_plan(records, trainer.placement)
    steps, updates = trainer.cfg.grpo.sampling_steps, len(metrics(tmp_path))
    assert updates == 2
    assert seen["transformer:rollout"] == expected["chunks"] * steps  # each chunk of 2 members alone
    # Once per wave that brings a prompt the cache does not hold (the synthetic tasks repeat prompts).
    known, encoding_waves = set(), 0
    for batch in [b for m in metrics(tmp_path) for b in m["rolled_out_batches"]]:
        _, prompts = batch_for_step(trainer.order, trainer.cfg.grpo.prompts_per_step, batch)
        for rows in trainer.waves:
            new = {clean_prompt(prompts[j].prompt) for j, _ in rows} - known
            encoding_waves += bool(new)
            known |= new
    assert seen["text_encoder:encode"] == encoding_waves >= 1
    assert seen["vae.encoder:encode"] >= expected["waves"] and seen["vae.decoder:decode"] >= expected["waves"]
    assert seen["parked"] == expected["chunks"] and seen["cache emptied"] == updates
    phases = [m[0] for m in trainer.placement.moves if m[1] == "text_encoder"]
    assert phases == ["encode", "rollout"] * expected["waves"]  # to the device per wave, off right after encoding
    assert [m[:2] for m in trainer.placement.moves if m[1] == "vae"] == expected["vae"]
    assert {r["dtype"] for r in records if "dtype" in r} == {torch.float32}  # model.frozen_dtype: float32 (tiny)


def test_a_schedule_that_forgets_the_vae_before_decoding_fails(tiny_model, dataset, tmp_path, monkeypatch):
    """Mutated: the VAE leaves the device after encoding (as on a rank that does not decode) and is not brought
    back for decoding. The schedule's own hook stops the run at the decoder; without that hook, the recorded
    forwards fail the check against the reference's plan."""
    real = offload.plan

    def forgetful(phase, on, decodes=True):
        plan = real(phase, on, decodes)
        return dict(plan, vae="host") if phase in ("rollout", "decode") else plan

    monkeypatch.setattr(offload, "plan", forgetful)
    cfg = offloaded()
    cfg["train"]["max_steps"] = 1
    trainer = trainer_in_process(cfg, tmp_path / "hooked", tiny_model, dataset)
    with pytest.raises(offload.OffloadError, match="the vae runs in phase 'decode'"):
        trainer.run()
    monkeypatch.setattr(offload.Placement, "_check", lambda self, name: lambda module, args: None)
    trainer = trainer_in_process(cfg, tmp_path / "unhooked", tiny_model, dataset)
    records = instrument(trainer)
    trainer.run()
    with pytest.raises(AssertionError, match="vae"):
        check_against_the_reference_plan(records, trainer.placement)


def test_a_schedule_that_keeps_the_text_encoder_through_replay_fails_the_check(
    tiny_model, dataset, tmp_path, monkeypatch
):
    """Mutated: the text encoder stays on the device for replay. Nothing frozen runs in replay, so only the
    records of the transformer's replay forwards show it, and the check against the reference's plan fails."""
    real = offload.plan
    monkeypatch.setattr(
        offload,
        "plan",
        lambda phase, on, decodes=True: (
            dict(real(phase, on, decodes), text_encoder="compute") if phase == "replay" else real(phase, on, decodes)
        ),
    )
    cfg = offloaded()
    cfg["train"]["max_steps"] = 1
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset)
    records = instrument(trainer)
    trainer.run()
    with pytest.raises(AssertionError, match="text_encoder"):
        check_against_the_reference_plan(records, trainer.placement)


def test_bf16_frozen_dtype_loads_and_runs_the_text_encoder_and_vae_in_bf16(tiny_model, dataset, tmp_path):
    cfg = offloaded()
    cfg["model"]["frozen_dtype"] = "bfloat16"
    cfg["train"]["max_steps"] = 1
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset)
    model = trainer.model
    assert {p.dtype for p in model.text_encoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.vae.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in trainer.experts.policy.parameters()} == {torch.float32}  # master weights untouched
    records = instrument(trainer)
    trainer.run()
    check_against_the_reference_plan(records, trainer.placement)
    ran = {(r["module"], r["dtype"]) for r in records if "dtype" in r}
    assert ran == {
        ("text_encoder", torch.bfloat16),
        ("vae.encoder", torch.bfloat16),
        ("vae.decoder", torch.bfloat16),
        ("transformer", torch.float32),
    }
    [m] = metrics(tmp_path)
    assert 0.0 <= m["reward_mean"] <= 1.0 and m["ppo_ratio_mean"] == 1.0


# ---- the prompt cache, chunks, the reference model ----------------------------------------------------------


def test_the_prompt_cache_evicts_the_least_recently_used_by_bytes():
    row = torch.ones(4, 8)  # 128 bytes in float32
    cache = PromptCache(max_bytes=3 * 128)
    for name in "abc":
        cache.put(name, row * ord(name))
    assert cache.get("a") is not None  # now b is the least recently used
    cache.put("d", row)
    assert "b" not in cache and {"a", "c", "d"} <= {n for n in "abcd" if n in cache}
    assert cache.bytes == 3 * 128 == sum(t.numel() * t.element_size() for t in cache.tensors())
    cache.put("wide", torch.ones(4, 16))  # 256 bytes: two entries must go
    assert cache.bytes <= 3 * 128 and "wide" in cache and len(cache) == 2
    cache.put("huge", torch.ones(4, 32))  # over the whole budget: not kept, nothing evicted for it
    assert "huge" not in cache and len(cache) == 2
    assert PromptCache(0).put("x", row) is None and len(PromptCache(0)) == 0


def test_the_model_caches_prompt_embeddings_on_cpu_within_its_bytes(tiny_model):
    from videogrpo.models.wan import WanTI2V

    fresh = WanTI2V(tiny_model, torch.device("cpu"), max_text_tokens=16, prompt_cache_bytes=0)
    one = fresh.encode_prompts(["x"])[0]
    per_prompt = one.numel() * 4  # cached as computed, float32
    wan = WanTI2V(tiny_model, torch.device("cpu"), max_text_tokens=16, prompt_cache_bytes=2 * per_prompt)
    calls = []
    wan.text_encoder.register_forward_pre_hook(lambda module, args: calls.append(len(args[0])))
    first = wan.encode_prompts(["a red square", "a blue circle", "a bar"])
    assert calls == [3] and len(wan._prompt_cache) == 2 and wan._prompt_cache.bytes == 2 * per_prompt
    assert all(t.device.type == "cpu" for t in wan._prompt_cache.tensors())
    again = wan.encode_prompts(["a bar", "a blue circle"])  # both kept (the two most recent)
    assert calls == [3] and torch.equal(again, first[[2, 1]])
    evicted = wan.encode_prompts(["a red square"])  # evicted: encoded again, to the same bytes
    assert (
        calls == [3, 1]
        and torch.equal(evicted[0], first[0])
        and torch.equal(evicted, fresh.encode_prompts(["a red square"]))
    )


def test_rollout_chunks_take_members_of_every_prompt_and_reassemble_in_wave_order():
    rows = [(j, g) for j in (0, 1) for g in (4, 5, 6, 7)]
    assert offload.rollout_chunks(rows, None) == [list(range(8))]
    positions = offload.rollout_chunks(rows, 3)
    assert positions == [[0, 1, 2, 4, 5, 6], [3, 7]]
    whole = Trajectory(torch.randn(8, 3, 2), torch.randn(8, 2), torch.rand(8))
    parts = [Trajectory(whole.latents[at], whole.log_probs[at], whole.etas[at]) for at in positions]
    back = offload.assemble(parts, positions)
    assert torch.equal(back.latents, whole.latents) and torch.equal(back.log_probs, whole.log_probs)
    assert torch.equal(back.etas, whole.etas)


def test_no_reference_model_is_built_at_kl_weight_zero(tiny_model, dataset, tmp_path):
    built = {}
    for kl in (0.0, 0.5):
        trainer = trainer_in_process(options(grpo={"kl_coeff": kl}), tmp_path / str(kl), tiny_model, dataset)
        trainer.scorer.close()
        built[kl] = trainer.experts.reference
    assert built[0.0] is None
    assert isinstance(built[0.5], torch.nn.Module) and not any(p.requires_grad for p in built[0.5].parameters())


def test_each_phase_gets_its_own_peak_and_the_period_their_maximum():
    """grpo/peak_memory.py's logic over a counter that behaves as CUDA's: the peak since the last reset, and a reset
    that starts it again from what is allocated."""
    from videogrpo.grpo.peak_memory import PeakMemory

    class Counter:
        allocated = peak = 0

        def max_memory_allocated(self, device):
            return self.peak

        def reset_peak_memory_stats(self, device):
            self.peak = self.allocated

        def use(self, nbytes):  # allocate (or free, negative) and move the peak as CUDA does
            self.allocated += nbytes
            self.peak = max(self.peak, self.allocated)

    counter = Counter()
    memory = PeakMemory(torch.device("cpu"), counter)
    counter.use(10)
    memory.reset()
    memory.enter("rollout")
    counter.use(50), counter.use(-50)  # the rollout's working set, freed before replay
    memory.enter("replay")
    counter.use(30), counter.use(-20)
    assert memory.phase_peaks() == {"rollout": 60, "replay": 40} and memory.peak() == 60
    memory.reset()  # the next period: the rollout peak of the last one is gone
    memory.enter("replay")
    assert memory.phase_peaks() == {"replay": 20} and memory.peak() == 20
    assert PeakMemory(torch.device("cpu")).peak() == 0  # no counter on CPU
