"""Models: Wan2.2 TI2V (one transformer) and I2V-A14B (two experts) behind one small interface the trainer and the
evaluation talk to (conditions, velocity, which expert), never to diffusers classes directly.

`wan.py` holds TI2V and the shared loaders, `i2v.py` the two experts and their routing, `prompt_cache.py` the text
encoder's cache, `lora.py` a trained transformer exported as LoRA adapters, fused into its base for evaluation.
May import only the core modules (`errors`); nothing here imports torch at package level, so the workflow can read
the folder names below without it.
"""

EXPORTED_EXPERTS = {"both": ("transformer", "transformer_2"), "high": ("transformer",), "low": ("transformer_2",)}
"""train.experts -> the expert folders train's export writes (i2v.py's EXPERT_FOLDERS: `transformer` is the
high-noise expert, `transformer_2` the low-noise one)."""


def trained_folders(cfg) -> tuple[str, ...]:
    """The folders of train's export (`<run>/train/final/`) that the trained model substitutes for its base
    pipeline's: TI2V's `transformer`; for I2V-A14B those of the experts `train.experts` trains (the others come
    from the base pipeline). Torch-free: the workflow reads it to name generate_cell's inputs."""
    if cfg.model.kind != "i2v_a14b":
        return ("transformer",)
    setting = cfg.train.experts
    if setting not in EXPORTED_EXPERTS:
        raise ValueError(f"train.experts = {setting!r}: use both, high or low")
    return EXPORTED_EXPERTS[setting]
