"""Data: the dataset's archives read safely (`archive`), materialized resumably (`materialize`), validated
(`validate`), its videos decoded and encoded (`video`), and the training dataset (`dataset`).

May import: `provenance`, `config` and the core modules.
"""
