"""Provenance: file and tree digests, stage manifests, the run report."""
