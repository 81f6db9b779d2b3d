"""The table of Wan transformer shapes (models/shapes.py): the real models' sizes, every entry a valid and complete
set of WanTransformer3DModel arguments, read-only, and the tiny default's pipelines built from it."""

from __future__ import annotations

import pytest
import torch

from videogrpo.models import shapes
from videogrpo.preflight import model_shape

ENTRIES = {
    name: value
    for name, value in vars(shapes).items()
    if name.isupper() and hasattr(value, "keys") and "num_attention_heads" in value  # the transformers' entries
}


def as_json(value):
    """A config value as config.json holds it (tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value


def test_the_table_holds_every_shape_the_project_names():
    assert set(ENTRIES) == {
        "WAN_TI2V_5B",
        "WAN_I2V_A14B_EXPERT",
        "TINY_TI2V",
        "TINY_I2V_EXPERT",
        "TINY_TENSOR_PARALLEL_EXPERT",
        "SMALL_TI2V",
        "SMALL_I2V_EXPERT",
        "MID_TI2V",
        "TINY_TI2V_5B_LAYOUT",
    }


@pytest.mark.parametrize(
    "name, billions",
    [("WAN_TI2V_5B", 5.0), ("WAN_I2V_A14B_EXPERT", 14.3)],  # "TI2V-5B"; "A14B": 14 B an expert, 27 B both
)
def test_the_real_models_have_their_published_size(name, billions):
    counts = model_shape.ParamCounts.from_shapes(model_shape.config_shapes(ENTRIES[name]))
    assert round(counts.total / 1e9, 1) == billions, counts.total


@pytest.mark.parametrize("name", ["WAN_TI2V_5B", "WAN_I2V_A14B_EXPERT"])
def test_the_real_models_entries_are_whole_config_files(name):
    """Every field a Diffusers transformer/config.json holds is written out, none left to the installed diffusers'
    defaults (which a release may change)."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        model = WanTransformer3DModel(**ENTRIES[name])
    written = {key: as_json(value) for key, value in model.config.items() if not key.startswith("_")}
    assert written == {key: as_json(value) for key, value in ENTRIES[name].items()}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_entry_builds_the_transformer_it_describes(name):
    """No argument misspelt or ignored: the model's config holds each value of the entry."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        model = WanTransformer3DModel(**ENTRIES[name])
    assert {key: as_json(model.config[key]) for key in ENTRIES[name]} == {
        key: as_json(value) for key, value in ENTRIES[name].items()
    }
    assert model.config.num_attention_heads * model.config.attention_head_dim == model.blocks[0].attn1.inner_dim


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entries_are_read_only(name):
    """A test that edited an entry in place would change the tiny default's weights for every later test."""
    with pytest.raises(TypeError):
        ENTRIES[name]["num_layers"] = 1


def test_the_real_frozen_models_build_from_their_entries():
    """The text encoder and VAEs `videogrpo plan` counts where no model is downloaded: UMT5-XXL's encoder 5.68 B,
    the Wan2.2 VAE 0.70 B, the Wan2.1 VAE 0.13 B parameters; read-only like the transformers' entries."""
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

    with torch.device("meta"):
        text = sum(p.numel() for p in UMT5EncoderModel(UMT5Config(**shapes.UMT5_XXL)).parameters())
        vaes = [
            sum(p.numel() for p in AutoencoderKLWan(**{k: as_json(v) for k, v in vae.items()}).parameters())
            for vae in (shapes.WAN_5B_VAE, shapes.WAN_21_VAE)
        ]
    assert (round(text / 1e9, 2), round(vaes[0] / 1e9, 2), round(vaes[1] / 1e9, 2)) == (5.68, 0.70, 0.13)
    assert (
        shapes.FROZEN_MODELS["ti2v"][1] is shapes.WAN_5B_VAE
        and shapes.FROZEN_MODELS["i2v_a14b"][1] is shapes.WAN_21_VAE
    )
    with pytest.raises(TypeError):
        shapes.UMT5_XXL["num_layers"] = 1


def test_the_tiny_pipelines_are_built_from_the_table():
    from videogrpo.demo.tiny_i2v import build_tiny_i2v_pipeline
    from videogrpo.demo.tiny_ti2v import build_tiny_pipeline

    ti2v = build_tiny_pipeline(seed=0)
    assert {key: ti2v.transformer.config[key] for key in shapes.TINY_TI2V} == dict(shapes.TINY_TI2V)
    i2v = build_tiny_i2v_pipeline(seed=0)
    for expert in (i2v.transformer, i2v.transformer_2):
        assert {key: expert.config[key] for key in shapes.TINY_I2V_EXPERT} == dict(shapes.TINY_I2V_EXPERT)
