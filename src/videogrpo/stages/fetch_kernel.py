"""fetch_kernel: the Hub kernel of a `*_hub` attention backend, pinned, in the cache training loads it from.

The repository (parallel.attention_kernel_repo) at its pinned commit is downloaded and verified by
hub.snapshot into `<cache>/../snapshot` (its partial download beside it, outside the declared output, so
an interrupted fetch resumes), then moved into a new cache in huggingface_hub's layout with the ref the
installed diffusers asks for (attention_kernel.py says why). The manifest lists every file of the cache.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo.artifacts import attention_kernel, hub
from videogrpo.errors import ConfigError
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, type=Path, help="kernel cache directory to create (KERNELS_CACHE)")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    p = cfg.parallel
    if why := attention_kernel.registry_problem(
        p.attention_backend, p.attention_kernel_repo, p.attention_kernel_revision
    ):
        raise ConfigError(why)
    _, _, version = attention_kernel.registry_entry(p.attention_backend)
    with StageRun("fetch_kernel", args.manifest, inputs={}, params=sections, upstream=args.upstream) as stage:
        staging = args.out.parent / "snapshot"
        known = hub.snapshot(
            p.attention_kernel_repo,
            p.attention_kernel_revision,
            staging,
            repo_type="kernel",
            allow_patterns=attention_kernel.KERNEL_FILES,
        )
        entries = attention_kernel.build_cache(
            args.out, staging, p.attention_kernel_repo, p.attention_kernel_revision, version, known
        )
        snapshot = attention_kernel.snapshot_dir(args.out, p.attention_kernel_repo, p.attention_kernel_revision)
        variants, _ = attention_kernel.build_variants(snapshot)
        stage.summary = {
            "repo_id": p.attention_kernel_repo,
            "revision": p.attention_kernel_revision,
            "backend": p.attention_backend,
            "version_ref": None if version is None else f"v{version}",
            "build_variants": variants,
        }
        stage.output("kernel", args.out, known=entries, complete=True)
    print(f"kernel cache ready: {args.out} ({len(variants)} build variants)")
    return 0
