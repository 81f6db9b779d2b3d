"""The Hub kernel of a `*_hub` attention backend: pinned, fetched once, loaded offline from its own cache.

diffusers' Hub attention backends (`_flash_3_hub`: `kernels-community/flash-attn3`) load their kernel when
the backend is set, with `kernels.get_kernel(repo, version=N)`, the repository and N from diffusers'
registry. Offline (HF_HUB_OFFLINE=1) `kernels` reads N's commit from `refs/vN` of its cache ($KERNELS_CACHE,
in huggingface_hub's layout: `kernels--<owner>--<name>/refs/vN`), finds the snapshot with huggingface_hub's
`snapshot_download(repo_type="kernel", revision=<commit>, local_files_only=True)`
(`kernels--<owner>--<name>/snapshots/<commit>/`) and imports the build variant of this machine's torch and
CUDA from its `build/` folder.

fetch_kernel fills a cache of exactly that shape holding one commit: the pinned revision
(parallel.attention_kernel_revision), downloaded and checked byte for byte by hub.snapshot, and `refs/vN`
naming it, N being what the installed diffusers asks for. The stock diffusers call then loads the pinned
bytes, and no other commit is there to be loaded instead. A branch name is never resolved online: the
upstream `vN` branch may have moved since the pin was chosen, and the cache's ref is ours, not the Hub's.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from videogrpo import atomic
from videogrpo.errors import ConfigError
from videogrpo.provenance import digest

# The build variants are all `kernels` loads (README and sources are not): every variant, since which one a
# node needs depends on its torch and CUDA, which the login node that downloads may not share.
KERNEL_FILES = ["build/*"]


def repo_folder(repo_id: str) -> str:
    """huggingface_hub's cache folder of a kernel repository (its `repo_folder_name(repo_type="kernel")`)."""
    return "kernels--" + repo_id.replace("/", "--")


def snapshot_dir(cache: Path, repo_id: str, revision: str) -> Path:
    return Path(cache) / repo_folder(repo_id) / "snapshots" / revision


def ref_file(cache: Path, repo_id: str, version: int) -> Path:
    return Path(cache) / repo_folder(repo_id) / "refs" / f"v{version}"


def loader_env(cache: Path) -> dict[str, str]:
    """What the processes that set the backend need to load the kernel from `cache` and never from the network.

    Importing the kernel's package from the snapshot would write `__pycache__/` into it (on the shared cache),
    and the next stage that checks the cache against fetch_kernel's manifest (a resumed training, a matrix cell)
    would find files fetch_kernel never fetched: no bytecode is written.
    """
    return {"KERNELS_CACHE": str(Path(cache).resolve()), "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def registry_entry(backend: str) -> tuple[str, str | None, int | None]:
    """(repository, revision, version) that the installed diffusers loads for a Hub backend."""
    from diffusers.models.attention_dispatch import _HUB_KERNELS_REGISTRY, AttentionBackendName

    try:
        entry = _HUB_KERNELS_REGISTRY[AttentionBackendName(backend)]
    except (KeyError, ValueError):
        raise ConfigError(
            f"parallel.attention_backend = {backend!r}: the installed diffusers loads no Hub kernel for it; use one "
            f"of {sorted(b.value for b in _HUB_KERNELS_REGISTRY)} or 'native'"
        ) from None
    return entry.repo_id, entry.revision, entry.version


def registry_problem(backend: str, repo_id: str, revision: str) -> str | None:
    """Why diffusers would load something else than `repo_id` at `revision` for `backend`; None if it would not."""
    want_repo, want_revision, version = registry_entry(backend)
    if want_repo != repo_id:
        return (
            f"parallel.attention_kernel_repo = {repo_id!r}, but diffusers loads {want_repo!r} for "
            f"parallel.attention_backend = {backend!r}: set parallel.attention_kernel_repo to {want_repo!r} and pin "
            f"one of its commits"
        )
    if want_revision is not None and want_revision != revision:
        return (
            f"parallel.attention_kernel_revision = {revision!r}, but this diffusers pins {want_revision!r} for "
            f"{backend!r}: pin that commit (and rerun fetch_kernel), or install the diffusers of envs/"
        )
    if want_revision is None and version is None:
        return f"diffusers names neither a revision nor a version for {backend!r}: unsupported by this pipeline"
    return None


def build_cache(
    out: Path, snapshot: Path, repo_id: str, revision: str, version: int | None, known: dict[str, tuple[str, int]]
) -> dict[str, tuple[str, int]]:
    """Move a verified snapshot into a new cache at `out` (atomically), with `refs/v<version>` naming it.

    `known` holds (sha256, size) per file of the snapshot; returned keyed by path in the cache, the ref
    file included.
    """
    folder = repo_folder(repo_id)
    with atomic.atomic_directory(out) as tmp:
        (tmp / folder / "snapshots").mkdir(parents=True)
        os.replace(snapshot, snapshot_dir(tmp, repo_id, revision))
        entries = {f"{folder}/snapshots/{revision}/{rel}": value for rel, value in known.items()}
        if version is not None:
            ref = ref_file(tmp, repo_id, version)
            ref.parent.mkdir(parents=True)
            # As huggingface_hub writes refs: the bare commit, no newline.
            ref.write_text(revision)
            entries[ref.relative_to(tmp).as_posix()] = (digest.sha256_file(ref), len(revision))
    return entries


def offline_snapshot(cache: Path, repo_id: str, version: int | None, revision: str | None = None) -> Path:
    """The snapshot `kernels` finds offline in `cache`: version N's commit from `refs/vN` (or `revision`),
    then huggingface_hub's own offline lookup of that commit, as kernels' cache resolver does."""
    from huggingface_hub import snapshot_download

    if revision is None:
        ref = ref_file(cache, repo_id, version)
        if not ref.is_file():
            raise FileNotFoundError(f"{ref}: no ref of version {version}")
        revision = ref.read_text().strip()
    return Path(
        snapshot_download(repo_id, repo_type="kernel", cache_dir=str(cache), revision=revision, local_files_only=True)
    )


def cache_problems(cache: Path, manifest: dict, repo_id: str, revision: str) -> list[str]:
    """Every way the cache differs from what fetch_kernel recorded for `repo_id` at `revision`, by file."""
    fix = "rerun fetch_kernel (snakemake --forcerun fetch_kernel)"
    summary = manifest.get("summary", {})
    if (summary.get("repo_id"), summary.get("revision")) != (repo_id, revision):
        return [
            f"fetch_kernel fetched {summary.get('repo_id')}@{summary.get('revision')}, the config pins "
            f"{repo_id}@{revision} (parallel.attention_kernel_repo/_revision): {fix}"
        ]
    snapshot = snapshot_dir(cache, repo_id, revision)
    if not snapshot.is_dir():
        held = sorted(p.name for p in snapshot.parent.iterdir()) if snapshot.parent.is_dir() else []
        return [f"{cache}: no snapshot of {repo_id} at {revision} (it holds {held or 'none'}): {fix}"]
    expected = {rel: tuple(value) for rel, value in manifest["outputs"]["kernel"]["entries"].items()}
    found = digest.tree_entries(cache)
    problems = []
    for rel in sorted(set(expected) | set(found)):
        want, got = expected.get(rel), found.get(rel)
        if want == got:
            continue
        if got is None:
            problems.append(f"{rel}: missing (recorded sha256 {want[0]}, {want[1]} bytes): {fix}")
        elif want is None:
            problems.append(f"{rel}: not fetched by fetch_kernel (sha256 {got[0]}): remove it, or {fix}")
        else:
            problems.append(
                f"{rel}: modified: sha256 {got[0]} ({got[1]} bytes), fetch_kernel recorded {want[0]} ({want[1]} "
                f"bytes): {fix}"
            )
    return problems


def kernels_installed() -> bool:
    return importlib.util.find_spec("kernels") is not None


def build_variants(snapshot: Path) -> tuple[list[str], str | None]:
    """The build variants in a snapshot, and the one the `kernels` package picks for this machine (None when it
    is not installed here, or picks none: a CPU-only torch, another torch or CUDA version)."""
    names = (
        sorted(p.name for p in (snapshot / "build").iterdir() if p.is_dir()) if (snapshot / "build").is_dir() else []
    )
    try:
        from kernels.variants import get_variants_local, resolve_variant
    except ImportError:
        return names, None
    try:
        variant, _ = resolve_variant(get_variants_local(snapshot / "build"))
    except Exception:  # no backend kernels knows on this machine
        return names, None
    return names, variant.variant_str if variant is not None else None


def variant_verdict(
    variants: list[str], chosen: str | None, kernels_installed: bool, cuda_visible: bool
) -> tuple[bool, str]:
    """Whether this machine can load one of the snapshot's build variants, as far as it can tell, and what it
    could not check. Only a CUDA machine with `kernels` installed (a GPU node in the GPU environment) knows:
    there, no variant for its torch and CUDA is a failure, since the training processes would fail the same way."""
    if chosen:
        return True, f"kernels picks build variant {chosen} here"
    if not kernels_installed:
        return True, "the kernels package is not installed here: which build variant loads is checked where it is"
    if not cuda_visible:
        return True, "no CUDA here: which CUDA build variant loads, and that it runs, is checked on a GPU node"
    return False, (
        f"kernels finds no build variant for this machine's torch and CUDA among {variants}: install the torch of "
        f"envs/gpu.txt (a build one of them matches), or pin a revision of parallel.attention_kernel_repo that has one"
    )


# What a process that sets the backend runs first (diffusers' own loader: kernels.get_kernel(repo, version=N)).
LOAD_PROBE = (
    "import sys\n"
    "from diffusers.models import attention_dispatch as ad\n"
    "backend = ad.AttentionBackendName(sys.argv[1])\n"
    "ad._maybe_download_kernel_for_backend(backend)\n"
    "entry = ad._HUB_KERNELS_REGISTRY[backend]\n"
    "print(sys.modules[entry.kernel_fn.__module__].__file__)\n"
)


def load_check(cfg, cache: Path | None, hostname: str, timeout_s: float = 600.0) -> tuple[bool, str]:
    """Whether this node loads the backend's Hub kernel from `cache` offline, as the training processes will: in
    a child process (the CUDA library it loads stays out of the launcher), with loader_env. (ok, detail)."""
    import subprocess
    import sys

    backend = cfg.parallel.attention_backend
    if cache is None:
        return False, f"{hostname}: parallel.attention_backend = {backend!r} loads a Hub kernel: give --kernel-cache"
    env = dict(os.environ, **loader_env(cache))
    try:
        run = subprocess.run(
            [sys.executable, "-c", LOAD_PROBE, backend], env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return False, f"{hostname}: loading the {backend} kernel from {cache} took over {timeout_s:.0f} s"
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
        return False, (
            f"{hostname}: the {backend} kernel does not load offline from {cache}: {last}; check the GPU "
            f"environment (kernels installed, a build variant for this torch and CUDA: preflight's attention_kernel "
            f"check lists them) or rerun fetch_kernel"
        )
    return True, f"{hostname}: {backend} loads offline from {run.stdout.strip()}"
