"""Data: the synthetic generator, safe materialization, validation, and the training dataset."""
