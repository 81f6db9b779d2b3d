"""Artifacts fetched from outside and checked byte for byte: pinned Hub snapshots (`hub`), safetensors files read by
their headers alone (`weights`, the one header reader), and the attention backend's Hub kernel (`attention_kernel`).

May import: `provenance`, `config` and the core modules (`errors`, `atomic`, `progress`); never torch at module level.
"""
