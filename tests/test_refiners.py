"""Prompt refiners trained with the generator (the `refiners` section, docs/options.md#prompt-refiners): a tiny
random Qwen2 (demo/tiny_refiner.py, loaded as transformers loads a Hub snapshot) rewrites each prompt, the generator
rolls out from the rewrite, the scorer scores against the sample's own prompt and task, and both train from the
same rewards, each with its own learning rate and clip.

Each expert's settings act on it alone: after one update (whose rollouts no update has touched yet) a change of the
refiner's learning rate or clip leaves the generator's weights bit-identical and moves the refiner's, and a change
of the generator's leaves the refiner's bit-identical. Under `per_expert` credit a refiner driven by a reward term
that scores every video alike gets zero advantage and keeps its weights, while the other learns. A kill -9 after a
checkpoint and a plain rerun give the uninterrupted run's weights of every expert, bit for bit, and its rewrites.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from videogrpo import config
from videogrpo.demo.stand_in_judge import JudgeServer
from videogrpo.errors import ConfigError

from conftest import PROTOCOL_FILE, RUBRIC_FILE
from harness import metrics, solo_config, tensors, train, trainer_config, trainer_in_process


@pytest.fixture(scope="module")
def tiny_refiner(tmp_path_factory):
    from videogrpo.demo.tiny_refiner import save_tiny_refiner

    out = tmp_path_factory.mktemp("refiner") / "writer"
    save_tiny_refiner(out, seed=0)
    return out


def expert(name: str, **settings) -> dict:
    return {"name": name, "source": "tiny", "max_new_tokens": 32, "lr": 1e-3, **settings}


def refiner_weights(out, name: str = "writer") -> dict:
    return load_file(out / "final/refiners" / name / "model.safetensors")


def rewrites(out) -> list[dict]:
    return [json.loads(line) for f in sorted((out / "final/rewrites").glob("*.jsonl")) for line in f.open()]


def test_a_refiner_and_the_generator_train_together_each_on_its_own_settings(
    tiny_model, dataset, tiny_refiner, tmp_path
):
    def run(name: str, refiner: dict | None = None, **train_settings):
        cfg = solo_config(train={"max_steps": 1, "save_steps": 0, **train_settings})
        cfg["refiners"] = {"experts": [expert("writer", kl_coeff=0.01, **(refiner or {}))], "original_members": 1}
        trainer = trainer_in_process(cfg, tmp_path / name, tiny_model, dataset, refiners={"writer": tiny_refiner})
        read, encode = [], trainer.model.encode_conditions
        trainer.model.encode_conditions = lambda texts, *rest: read.extend(texts) or encode(texts, *rest)
        trainer.run()
        return tmp_path / name, read

    base, read = run("base")
    rows = rewrites(base)
    # The generator read each row's last rewrite (or the prompt where it fell back, or the kept member's).
    assert [r["generator_prompt"] for r in rows] == read and len(rows) == 4
    assert [r["rewrites"] for r in rows if r["member"] == 0] == [[]]  # refiners.original_members: 1
    used = [r for r in rows if r["rewrites"] and r["rewrites"][0]["fallback"] is None]
    cut = [r for r in rows if r["rewrites"] and r["rewrites"][0]["fallback"] == "cut"]
    assert used and all(r["generator_prompt"] != r["original"] for r in used)
    assert all(r["generator_prompt"] == r["original"] for r in cut)
    [line] = metrics(base)
    assert line["refiner/writer/rewrites"] == 3 and line["refiner/writer/fallback_cut"] == len(cut)
    assert line["refiner/writer/version"] == 1 and line["refiner/writer/advantage_abs_mean"] > 0
    # Its FLOPs: 2 x its parameters but the embedding table per token of the chat and the rewrite, sampled once and
    # replayed (3 forwards' worth) with the frozen copy's forward (kl_coeff > 0).
    import torch

    from videogrpo.config.refiners_section import DEFAULT_SYSTEM_PROMPT
    from videogrpo.models.refiner import Refiner

    refiner = Refiner.load(tiny_refiner, torch.device("cpu"))
    params = sum(p.numel() for n, p in refiner.model.named_parameters() if "embed_tokens" not in n)
    made = [r["rewrites"][0] for r in rows if r["rewrites"]]
    tokens = sum(len(refiner.chat_ids(DEFAULT_SYSTEM_PROMPT, m["text_in"])) + len(m["tokens"]) for m in made)
    assert line["refiner/writer/flops_per_update"] == 2.0 * params * tokens * (1 + 4)

    initial = load_file(tiny_refiner / "model.safetensors")
    generator_initial = load_file(tiny_model / "transformer/diffusion_pytorch_model.safetensors")
    trained = refiner_weights(base)
    assert any((trained[k] - initial[k]).abs().max() > 0 for k in initial)  # both experts moved
    assert any((tensors(base)[k] - generator_initial[k]).abs().max() > 0 for k in generator_initial)

    def same(a: dict, b: dict) -> bool:
        return all((a[k] == b[k]).all() for k in a)

    for name, refiner, settings, moved in (
        ("refiner_lr", {"lr": 3e-3}, {}, "refiner"),
        ("refiner_clip", {"max_grad_norm": 1e-3}, {}, "refiner"),
        ("generator_lr", None, {"lr": 3e-4}, "generator"),
        ("generator_clip", None, {"max_grad_norm": 1e-5}, "generator"),
    ):
        out, _ = run(name, refiner, **settings)
        refiner_same, generator_same = same(refiner_weights(out), trained), same(tensors(out), tensors(base))
        assert (refiner_same, generator_same) == ((False, True) if moved == "refiner" else (True, False)), name
        assert rewrites(out) == rows, name  # one update: the rollouts came before any weight changed


def test_a_vision_language_refiner_sees_the_first_frame(tiny_model, dataset, tmp_path):
    """A tiny Qwen2.5-VL refiner (refiners.experts[].vision) rewrites each prompt with the sample's first frame in its
    chat; the replay shows it the frame again, so its first update's ratio is 1 (no token clipped). A language model
    named as a vision one is refused, naming the field."""
    from videogrpo.demo.tiny_refiner import save_tiny_refiner

    save_tiny_refiner(tmp_path / "seer", 0, vision=True)
    cfg = solo_config(train={"max_steps": 1, "save_steps": 0})
    cfg["refiners"] = {"experts": [expert("seer", vision=True, loss="ppo_clip", clip_range=1e-4)]}
    trainer = trainer_in_process(cfg, tmp_path / "run", tiny_model, dataset, refiners={"seer": tmp_path / "seer"})
    seen = []
    for e in trainer.refiners.experts:
        chat = e.refiner.chat
        e.refiner.chat = lambda system, text, image=None, chat=chat: seen.append(image) or chat(system, text, image)
    trainer.run()
    [line] = metrics(tmp_path / "run")
    assert line["refiner/seer/clip_fraction"] == 0 and line["refiner/seer/rewrites"] == 4
    assert seen and all(str(image).endswith("first_frame.png") for image in seen)  # sampled and replayed with it
    trained, initial = refiner_weights(tmp_path / "run", "seer"), load_file(tmp_path / "seer/model.safetensors")
    assert any((trained[k] - initial[k]).abs().max() > 0 for k in initial)
    assert any("visual" in k for k in trained)

    cfg["refiners"] = {"experts": [expert("seer", vision=False)]}
    with pytest.raises(Exception, match=r"refiners.experts\[0\].vision = false, but .* is a vision-language model"):
        trainer_in_process(cfg, tmp_path / "wrong", tiny_model, dataset, refiners={"seer": tmp_path / "seer"})


def test_validation_reads_the_refiners_rewrites(tiny_model, dataset, tiny_refiner, tmp_path):
    """A validation point rolls out the held-out prompts as the trained system would: rewritten by the refiners,
    their draws keyed by the prompt (the same at every point, but for the refiners' weights)."""
    cfg = solo_config(
        train={
            "max_steps": 1,
            "save_steps": 0,
            "validate_before_training": True,
            "validate_every": 1,
            "validate_prompts": 2,
        }
    )
    cfg["refiners"] = {"experts": [expert("writer", lr=1e-9)]}  # its weights barely move: the same rewrites
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset, refiners={"writer": tiny_refiner})
    from videogrpo.grpo import validation

    held = [s.prompt for s in validation.prompts(trainer.cfg, dataset)]
    read, encode = [], trainer.model.encode_conditions

    def recording(texts, *rest, **options):
        if options.get("cached") is False:  # validation bypasses the prompt cache
            read.append(list(texts))
        return encode(texts, *rest, **options)

    trainer.model.encode_conditions = recording
    trainer.run()
    assert len(read) == 2 and read[0] == read[1]  # points 0 and 1
    assert any(text not in held for text in read[0])  # rewritten (where a rewrite did not fall back)
    assert sum("val/reward_mean" in m for m in metrics(tmp_path)) == 2


def test_per_expert_credit_drives_each_refiner_by_its_own_term(tiny_model, dataset, tiny_refiner, tmp_path):
    with JudgeServer(pays="constant") as server:
        cfg = solo_config(train={"max_steps": 2, "save_steps": 0})
        cfg["reward"].update(
            terms={"vbvr_rule": 0.7, "vbvr_vlm": 0.3},
            judge_endpoint=server.endpoint,
            judge_prompts=str(RUBRIC_FILE),
            judge_protocol=str(PROTOCOL_FILE),
            judge_max_retries=0,
        )
        cfg["refiners"] = {
            "experts": [expert("steady", reward_term="vbvr_vlm"), expert("learner", reward_term="vbvr_rule")],
            "credit": "per_expert",
        }
        paths = {"steady": tiny_refiner, "learner": tiny_refiner}
        trainer_in_process(cfg, tmp_path, tiny_model, dataset, refiners=paths).run()
    lines = metrics(tmp_path)
    assert all(m["reward/vbvr_vlm"] == 0.5 for m in lines)  # the judge's term scores every video alike
    assert all(m["refiner/steady/advantage_abs_mean"] == 0 for m in lines)
    assert all(m["refiner/learner/advantage_abs_mean"] > 0 and m["advantage_mean"] is not None for m in lines)
    initial = load_file(tiny_refiner / "model.safetensors")
    steady, learner = refiner_weights(tmp_path, "steady"), refiner_weights(tmp_path, "learner")
    assert all((steady[k] == initial[k]).all() for k in initial)
    assert any((learner[k] - initial[k]).abs().max() > 0 for k in initial)
    # The learner rewrote what the steady refiner wrote.
    for row in rewrites(tmp_path):
        first, second = row["rewrites"]
        assert second["text_in"] == first["text_out"] and row["generator_prompt"] == second["text_out"]


def test_the_hierarchical_layout_shares_each_rewrite_over_its_videos(tiny_model, dataset, tiny_refiner, tmp_path):
    """UniRL's layout: N = 2 rewrites x M = 2 videos of each prompt. A rewrite's members read it alike, its first
    trains the refiner on it; the refiner's advantage is its rewrite's over the prompt's rewrites (of their videos'
    mean reward), a video's over its rewrite's videos, both over sqrt(population variance + 1e-8)."""
    import numpy as np

    cfg = solo_config(train={"max_steps": 2, "save_steps": 0})
    cfg["refiners"] = {"experts": [expert("writer")], "credit": "hierarchical", "rewrites_per_prompt": 2}
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset, refiners={"writer": tiny_refiner})
    seen, advantages = [], trainer._advantages
    trainer._advantages = lambda prepared: seen.append(advantages(prepared)) or seen[-1]
    trainer.run()

    def population(rewards):  # over the last axis, as UniRL's trainer normalises
        rewards = np.asarray(rewards, dtype=np.float64)
        centred = rewards - rewards.mean(axis=-1, keepdims=True)
        return centred / np.sqrt(rewards.var(axis=-1, keepdims=True) + 1e-8)

    for gathered in seen:
        rewards = gathered["rewards"].numpy().reshape(1, 2, 2)  # 1 prompt x 2 rewrites x 2 videos
        np.testing.assert_allclose(gathered["advantages"].numpy().reshape(1, 2, 2), population(rewards), atol=1e-5)
        by_rewrite = np.repeat(population(rewards.mean(axis=2)), 2, axis=1)
        np.testing.assert_allclose(gathered["refiner_advantages"]["writer"].numpy(), by_rewrite, atol=1e-5)
    rows = rewrites(tmp_path)
    for batch in {r["batch"] for r in rows}:
        mine = sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["member"])
        assert mine[0]["generator_prompt"] == mine[1]["generator_prompt"]
        assert mine[2]["generator_prompt"] == mine[3]["generator_prompt"]
        assert [r["rewrites"][0]["trained"] for r in mine] == [True, False, True, False]
    assert all(m["refiner/writer/rewrites"] == 2 for m in metrics(tmp_path))


def test_the_refiners_update_does_not_depend_on_the_ranks(tiny_model, dataset, tiny_refiner, tmp_path):
    """One update of 2 prompts on one rank (it serves both) and on two (one prompt each, the refiner's gradients
    averaged): the same rewrites and the same refiner weights to round-off, under each normalization. Then two ranks
    with FSDP and delayed replay (each batch replayed one update late, its rewrites with it) train to the end."""
    import torch

    for normalization in ("sequence_token_mean", "token_mean"):
        runs = {}
        for procs in (1, 2):
            cfg = trainer_config(grpo={"prompts_per_step": 2}, train={"max_steps": 1, "save_steps": 0})
            cfg["parallel"].update(procs_per_node=procs, data_parallel="replicate")
            cfg["refiners"] = {"experts": [expert("writer", normalization=normalization, loss="ppo_clip")]}
            out = tmp_path / f"{normalization}-{procs}"
            assert train(cfg, out, tiny_model, dataset, refiners={"writer": tiny_refiner})
            runs[procs] = out
        assert rewrites(runs[1]) == rewrites(runs[2])
        one, two = refiner_weights(runs[1]), refiner_weights(runs[2])
        assert max(float((one[k] - two[k]).abs().max()) for k in one) <= 1e-6, normalization
        assert any(float((one[k] - load_file(tiny_refiner / "model.safetensors")[k]).abs().max()) > 0 for k in one)
        [a], [b] = metrics(runs[1]), metrics(runs[2])
        assert a["refiner/writer/loss"] == pytest.approx(b["refiner/writer/loss"], abs=1e-6)
        assert a["refiner/writer/flops_per_update"] == b["refiner/writer/flops_per_update"]

    cfg = trainer_config(grpo={"prompts_per_step": 2, "delayed_replay": True}, train={"max_steps": 3, "save_steps": 0})
    cfg["parallel"].update(data_parallel="fsdp")
    cfg["refiners"] = {"experts": [expert("writer", loss="ppo_clip")]}
    assert train(cfg, tmp_path / "fsdp", tiny_model, dataset, refiners={"writer": tiny_refiner})
    lines = metrics(tmp_path / "fsdp")
    assert len(lines) >= 2 and [m["refiner/writer/version"] for m in lines] == list(range(1, len(lines) + 1))
    assert [m["replayed_batch"] for m in lines] == list(range(len(lines)))
    assert all(torch.isfinite(torch.tensor(m["refiner/writer/grad_norm"])) for m in lines)


def test_a_kill_and_a_rerun_resume_every_expert_bit_identically(tiny_model, dataset, tiny_refiner, tmp_path):
    cfg = trainer_config(grpo={"prompts_per_step": 2}, train={"max_steps": 3, "save_steps": 1})
    # A fully fine-tuned refiner, then one with LoRA adapters (its KL's reference: the base, adapters off).
    lora = expert("adapted", kl_coeff=0.01, lora_rank=4, lr=1e-2)
    cfg["refiners"] = {"experts": [expert("writer", loss="ppo_clip", kl_coeff=0.01), lora]}
    paths = {"writer": tiny_refiner, "adapted": tiny_refiner}
    assert train(cfg, tmp_path / "whole", tiny_model, dataset, refiners=paths)
    killed = tmp_path / "killed"
    assert not train(
        cfg,
        killed,
        tiny_model,
        dataset,
        kill_when=lambda out: (out / "checkpoints/step-00000001/COMPLETE").exists(),
        refiners=paths,
    )
    assert not (killed / "final").exists()
    assert train(cfg, killed, tiny_model, dataset, refiners=paths)
    assert "resumed from" in (killed / "log.txt").read_text()
    for name in ("writer", "adapted"):
        whole, resumed = refiner_weights(tmp_path / "whole", name), refiner_weights(killed, name)
        assert all((whole[k] == resumed[k]).all() for k in whole), name
    adapters = load_file(killed / "final/refiners/adapted/adapters/adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)  # and the merged model beside them moved
    initial = load_file(tiny_refiner / "model.safetensors")
    assert any((refiner_weights(killed, "adapted")[k] - initial[k]).abs().max() > 0 for k in initial)
    lines = metrics(killed)
    assert lines[-1]["refiner/adapted/kl"] > 0 and lines[0]["refiner/adapted/kl"] == 0  # the base is the reference
    a, b = tensors(tmp_path / "whole"), tensors(killed)
    assert all((a[k] == b[k]).all() for k in a)
    assert rewrites(killed) == rewrites(tmp_path / "whole")
    versions = [m["refiner/writer/version"] for m in metrics(killed)]
    assert versions == [1, 2, 3]


@pytest.mark.parametrize(
    ("refiners", "said"),
    [
        ({"experts": [{"name": "w", "source": "hub"}]}, "refiners.experts[0].revision = ''"),
        ({"experts": [{"name": "W x", "source": "tiny"}]}, "refiners.experts[0].name = 'W x'"),
        ({"experts": [{"name": "a", "source": "tiny"}] * 2}, "names ['a', 'a'] repeat"),
        ({"experts": [{"name": "a", "source": "tiny", "top_p": 0}]}, "refiners.experts[0].top_p = 0.0"),
        ({"experts": [{"name": "a", "source": "tiny"}], "credit": "per_expert"}, "reward_term = ''"),
        ({"experts": [{"name": "a", "source": "tiny"}], "original_members": 4}, "original_members = 4"),
        ({"experts": []}, "matrix.models lists 'refined'"),
        ({"experts": [{"name": "a", "source": "tiny"}], "credit": "hierarchical"}, "rewrites_per_prompt = 0"),
        (
            {"experts": [{"name": "a", "source": "tiny"}], "credit": "hierarchical", "rewrites_per_prompt": 4},
            "= 4: must",
        ),
    ],
)
def test_the_refiners_rules_name_the_field(refiners, said):
    cfg = trainer_config()
    cfg["refiners"] = refiners
    cfg["matrix"] = {"models": ["trained", "refined"]}
    with pytest.raises(ConfigError, match=said.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        config.from_dict(cfg)


def test_the_refiners_are_off_by_default_and_out_of_every_released_identity():
    cfg = config.from_dict(trainer_config())
    assert not cfg.has_refiners
    on = trainer_config()
    on["refiners"] = {"experts": [{"name": "a", "source": "tiny"}]}
    assert config.run_identity(config.from_dict(on)) != config.run_identity(cfg)


def test_the_memory_plan_holds_each_refiner_on_every_rank(tiny_model, tiny_refiner):
    """Each refiner's float32 weights, gradients, AdamW moments and (kl_coeff > 0) frozen copy on every rank, and one
    rewrite's replay, which comes after the generator's (the larger counts); a real refiner's shape from its
    published config without its download (Qwen2.5-VL-3B: 3,754,622,976 parameters)."""
    import torch

    from videogrpo.models.refiner import Refiner
    from videogrpo.preflight import memory_plan, refiner_memory
    from videogrpo.preflight.model_shape import ModelShape

    cfg = trainer_config()
    revision = "0" * 40
    cfg["refiners"] = {
        "experts": [
            expert("writer", kl_coeff=0.01),
            {"name": "seer", "repo_id": "Qwen/Qwen2.5-VL-3B-Instruct", "revision": revision, "vision": True},
        ]
    }
    resolved = config.from_dict(cfg)
    plan = memory_plan.plan_for_config(resolved, ModelShape.from_model_dir(tiny_model))
    terms = {t.name: t for t in plan.terms}
    tiny = sum(p.numel() for p in Refiner.load(tiny_refiner, torch.device("cpu")).model.parameters())
    assert terms["refiner writer"].bytes == 5 * 4 * tiny  # with its frozen copy
    assert terms["refiner seer"].bytes == 4 * 4 * 3_754_622_976
    cfg["refiners"]["experts"][1]["lora_rank"] = 16  # rank 16 on its language model's 36 x 7 linear layers
    lora = {t.name: t for t in refiner_memory.terms(config.from_dict(cfg), ("rollout", "replay"))}
    assert lora["refiner seer"].bytes == 4 * (3_754_622_976 + 4 * 29_933_568)
    cfg["refiners"]["experts"][1]["lora_rank"] = 0
    assert terms["refiner seer replay"].alternative == terms["activations"].alternative != ""
    replay = sum(
        t.bytes for t in plan.terms if "replay" in t.phases and t.alternative == terms["activations"].alternative
    )
    alone = plan.phase_total("replay") - max(terms["activations"].bytes, terms["refiner seer replay"].bytes)
    assert replay > plan.phase_total("replay") - alone  # the working sets are not summed

    cfg["refiners"]["experts"][1]["repo_id"] = "someone/unknown-refiner"
    terms = {t.name: t for t in refiner_memory.terms(config.from_dict(cfg), ("rollout", "replay"))}
    assert terms["refiner seer"].bytes == 0 and "downloaded by fetch_refiner" in terms["refiner seer"].detail
