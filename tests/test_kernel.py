"""The FlashAttention-3 Hub kernel as a pinned artifact: fetched through the loopback Hub (a stand-in kernel
repository of the real layout), laid out as `kernels` reads its cache offline, and checked by preflight."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from demo import CELLS

from videogrpo.artifacts import attention_kernel as ak
from videogrpo.config import Config, ParallelConfig, problems
from videogrpo.preflight.checks import check_attention_kernel

from hub_server import HubServer

REPO_ID = "kernels-community/flash-attn3"
COMMIT = "43f0bd269777115d94ff826e0d113ce9c1c9087b"
OTHER = "0123456789abcdef0123456789abcdef01234567"
# What kernel-builder publishes per build variant: the package, its op loader, the CUDA library (named by a
# build hash), the metadata kernels validates, and the compatibility package named after the repository.
VARIANTS = ("torch211-cxx11-cu126-x86_64-linux", "torch213-cxx11-cu130-x86_64-linux")


def variant_files(variant: str, ops: str) -> dict[str, bytes]:
    base = f"build/{variant}"
    metadata = {
        "name": "flash-attn3",
        "id": f"_flash_attn3_cuda_{ops}",
        "version": 1,
        "license": "bsd-3-clause",
        "python-depends": [],
        "backend": {"type": "cuda", "archs": ["8.0", "9.0a"]},
    }
    return {
        f"{base}/__init__.py": b"from .flash_attn_interface import flash_attn_func, flash_attn_varlen_func\n",
        f"{base}/_ops.py": f"import torch\nops = torch.ops._flash_attn3_{ops}\n".encode(),
        f"{base}/_flash_attn3_{ops}.abi3.so": b"\x7fELF" + bytes(range(256)) * 64 + variant.encode(),
        f"{base}/flash_attn_interface.py": b"def flash_attn_func(*a, **k):\n    raise RuntimeError('CUDA only')\n",
        f"{base}/flash_attn_config.py": b"CONFIG = {}\n",
        f"{base}/metadata.json": json.dumps(metadata, indent=2).encode(),
        f"{base}/flash_attn3/__init__.py": b"from .. import *\n",
    }


def stand_in() -> dict[str, bytes]:
    files = {"README.md": b"---\nlicense: bsd-3-clause\ntags:\n  - kernel\n---\n# Flash Attention 3\n"}
    files[".gitattributes"] = b"*.so filter=lfs diff=lfs merge=lfs -text\n"
    for i, variant in enumerate(VARIANTS):
        files.update(variant_files(variant, f"{i}a2b3c4"))
    return files


def hub_env(endpoint: str, home: Path, **extra: str) -> dict:
    return dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", **extra)


def fetch(endpoint: str, out: Path, manifest: Path, revision: str = COMMIT) -> subprocess.CompletedProcess:
    sections = {
        "parallel": {
            "attention_backend": "_flash_3_hub",
            "attention_kernel_repo": REPO_ID,
            "attention_kernel_revision": revision,
        }
    }
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "videogrpo"),
            "stage",
            "fetch-kernel",
            "--config-json",
            json.dumps(sections),
            "--out",
            str(out),
            "--manifest",
            str(manifest),
        ],
        env=hub_env(endpoint, out.parent / "hf-home"),
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def fetched(tmp_path_factory):
    """fetch-kernel once through the loopback Hub: (cache, manifest, the served files, the Hub's request log)."""
    root = tmp_path_factory.mktemp("kernel")
    files = stand_in()
    with HubServer({("kernel", REPO_ID): {COMMIT: files}}) as hub:
        result = fetch(hub.endpoint, root / "cache", root / "fetch_kernel.manifest.json")
        log = list(hub.log)
    assert result.returncode == 0, result.stderr
    return root / "cache", root / "fetch_kernel.manifest.json", files, log


@pytest.fixture
def copy(fetched, tmp_path):
    """A copy of the fetched cache to damage, and the manifest fetch_kernel wrote for it."""
    cache, manifest, _, _ = fetched
    shutil.copytree(cache, tmp_path / "cache", symlinks=True)
    return tmp_path / "cache", manifest


def kernel_cfg(revision: str = COMMIT, repo_id: str = REPO_ID) -> Config:
    return Config(
        parallel=ParallelConfig(
            attention_backend="_flash_3_hub", attention_kernel_repo=repo_id, attention_kernel_revision=revision
        )
    )


def test_fetch_writes_a_kernels_cache_of_the_pinned_commit_and_a_manifest_of_every_file(fetched):
    from huggingface_hub.file_download import repo_folder_name

    cache, manifest_path, files, log = fetched
    assert ak.repo_folder(REPO_ID) == repo_folder_name(repo_id=REPO_ID, repo_type="kernel")
    snapshot = cache / f"kernels--kernels-community--flash-attn3/snapshots/{COMMIT}"
    build = {name: data for name, data in files.items() if name.startswith("build/")}
    got = {p.relative_to(snapshot).as_posix(): p.read_bytes() for p in snapshot.rglob("*") if p.is_file()}
    assert got == build, "the build variants, byte for byte, and nothing else (no README)"
    ref = cache / "kernels--kernels-community--flash-attn3/refs/v1"
    assert ref.read_text() == COMMIT, "the version diffusers asks for (1) names the pinned commit"
    on_hub = [r for r in log if r.origin == "hub"]
    assert any(r.path.startswith(f"/api/kernels/{REPO_ID}/tree/{COMMIT}") for r in on_hub)
    assert all(f"/{COMMIT}" in r.path for r in on_hub), "never a branch name"
    assert any(r.origin == "storage" for r in log), "the .so files come through LFS redirects"
    manifest = json.loads(manifest_path.read_text())
    entries = manifest["outputs"]["kernel"]["entries"]
    on_disk = {p.relative_to(cache).as_posix(): p for p in cache.rglob("*") if p.is_file()}
    assert set(entries) == set(on_disk) and len(entries) == len(build) + 1
    from videogrpo.provenance.digest import sha256_file

    assert all(entries[rel] == [sha256_file(p), p.stat().st_size] for rel, p in on_disk.items())
    assert manifest["summary"]["revision"] == COMMIT and manifest["summary"]["version_ref"] == "v1"
    assert manifest["summary"]["build_variants"] == sorted(VARIANTS)
    assert not (cache.parent / "snapshot").exists() and not (cache.parent / ".snapshot.partial").exists()


def test_offline_the_pinned_snapshot_is_what_huggingface_hubs_lookup_finds_and_nothing_else(fetched):
    """In a process with HF_HUB_OFFLINE=1 and KERNELS_CACHE set, as training has them: refs/v1, then
    snapshot_download(repo_type="kernel", local_files_only=True), the two steps of kernels' cache resolver."""
    cache, _, _, _ = fetched
    code = (
        "import os, sys; from pathlib import Path; from huggingface_hub import snapshot_download; "
        "from huggingface_hub.errors import LocalEntryNotFoundError\n"
        "from videogrpo.artifacts import attention_kernel as ak\n"
        "cache = Path(os.environ['KERNELS_CACHE'])\n"
        f"print(ak.offline_snapshot(cache, {REPO_ID!r}, 1))\n"
        "try:\n"
        f"    snapshot_download({REPO_ID!r}, repo_type='kernel', cache_dir=str(cache), revision={OTHER!r})\n"
        "except LocalEntryNotFoundError:\n"
        "    print('other commit: not in the cache')\n"
    )
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", **ak.loader_env(cache))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found, other = result.stdout.splitlines()
    assert Path(found) == (cache / f"kernels--kernels-community--flash-attn3/snapshots/{COMMIT}").resolve()
    assert other == "other commit: not in the cache"
    _, manifest, _, _ = fetched
    assert ak.cache_problems(cache, json.loads(manifest.read_text()), REPO_ID, COMMIT) == [], (
        "the lookups wrote nothing"
    )


def test_preflight_passes_on_the_fetched_cache_and_says_what_it_checked(copy):
    cache, manifest = copy
    check = check_attention_kernel(kernel_cfg(), cache, manifest)
    assert check.ok, check.detail
    assert f"{REPO_ID}@{COMMIT}: every file as fetch_kernel recorded it, found offline through refs/v1" in check.detail
    assert "2 build variants" in check.detail
    if not ak.kernels_installed():
        assert "the kernels package is not installed here" in check.detail
    else:  # only CUDA variants, as the real repository has, and a CPU config here
        assert (
            "no CUDA here: which CUDA build variant loads, and that it runs, is checked on a GPU node" in check.detail
        )


def test_preflight_names_a_modified_kernel_file_with_both_digests(copy):
    from videogrpo.provenance.digest import sha256_file

    cache, manifest = copy
    rel = f"kernels--kernels-community--flash-attn3/snapshots/{COMMIT}/build/{VARIANTS[1]}/_flash_attn3_1a2b3c4.abi3.so"
    recorded = json.loads(manifest.read_text())["outputs"]["kernel"]["entries"][rel][0]
    with open(cache / rel, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x00")
    check = check_attention_kernel(kernel_cfg(), cache, manifest)
    assert not check.ok
    assert f"{rel}: modified: sha256 {sha256_file(cache / rel)}" in check.detail
    assert f"fetch_kernel recorded {recorded}" in check.detail and "rerun fetch_kernel" in check.detail


def test_preflight_names_a_removed_file_and_a_foreign_one(copy):
    cache, manifest = copy
    snapshot = cache / f"kernels--kernels-community--flash-attn3/snapshots/{COMMIT}"
    (snapshot / f"build/{VARIANTS[0]}/metadata.json").unlink()
    (snapshot / f"build/{VARIANTS[0]}/evil.py").write_text("import os\n")
    check = check_attention_kernel(kernel_cfg(), cache, manifest)
    assert not check.ok
    assert f"build/{VARIANTS[0]}/metadata.json: missing (recorded sha256 " in check.detail
    assert f"build/{VARIANTS[0]}/evil.py: not fetched by fetch_kernel" in check.detail


def test_preflight_refuses_a_ref_that_names_another_commit(copy):
    cache, manifest = copy
    (cache / "kernels--kernels-community--flash-attn3/refs/v1").write_text(OTHER)
    check = check_attention_kernel(kernel_cfg(), cache, manifest)
    assert not check.ok and "refs/v1: modified" in check.detail


def test_preflight_refuses_a_cache_of_another_revision_than_the_config_pins(copy):
    cache, manifest = copy
    check = check_attention_kernel(kernel_cfg(revision=OTHER), cache, manifest)
    assert not check.ok
    assert f"fetch_kernel fetched {REPO_ID}@{COMMIT}, the config pins {REPO_ID}@{OTHER}" in check.detail
    # A manifest that says OTHER, over a cache that holds COMMIT: the snapshot is named missing.
    record = json.loads(manifest.read_text())
    record["summary"]["revision"] = OTHER
    (cache.parent / "other.manifest.json").write_text(json.dumps(record))
    check = check_attention_kernel(kernel_cfg(revision=OTHER), cache, cache.parent / "other.manifest.json")
    assert not check.ok and f"no snapshot of {REPO_ID} at {OTHER} (it holds ['{COMMIT}'])" in check.detail


def test_a_kernel_repo_other_than_the_one_diffusers_loads_is_refused_naming_both(copy):
    cache, manifest = copy
    check = check_attention_kernel(kernel_cfg(repo_id="someone/flash-attn3"), cache, manifest)
    assert not check.ok
    assert "parallel.attention_kernel_repo = 'someone/flash-attn3', but diffusers loads" in check.detail
    assert REPO_ID in check.detail


def test_the_kernel_pins_are_checked_only_for_a_hub_backend():
    bad = {"attention_kernel_revision": "main", "attention_kernel_repo": "flash-attn3"}
    found = problems(Config(parallel=ParallelConfig(attention_backend="_flash_3_hub", **bad)), {"parallel"})
    assert any(p.startswith("parallel.attention_kernel_revision = 'main': must be a lower-case 40-hex") for p in found)
    assert any(p.startswith("parallel.attention_kernel_repo = 'flash-attn3': must be a Hub repository") for p in found)
    assert problems(Config(parallel=ParallelConfig(attention_backend="native", **bad)), {"parallel"}) == []


def test_an_unknown_revision_fails_the_fetch_naming_it_and_leaves_no_cache(tmp_path):
    with HubServer({("kernel", REPO_ID): {COMMIT: stand_in()}}) as hub:
        result = fetch(hub.endpoint, tmp_path / "cache", tmp_path / "m.json", revision=OTHER)
    assert result.returncode != 0
    assert f"kernel {REPO_ID}@{OTHER}: not found on the Hub" in result.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "m.json").exists()


def test_the_recipes_fetch_the_kernel_and_every_stage_that_sets_the_backend_loads_it_offline(repo, tmp_path):
    """The DAG (dry run): fetch_kernel's cache an input of preflight, train and the matrix's generate_cell (the
    held-out check's cells among them), each pointed at it (training through --kernel-cache, the others through
    the shell's environment); the tiny default (native attention) has no fetch_kernel at all."""

    def dry(*args: str) -> str:
        out = subprocess.run(
            ["snakemake", "-n", "-p", "--cores", "1", *args, "--config", f"results={tmp_path}"],
            cwd=repo,
            capture_output=True,
            text=True,
            env=dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"),
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    def command(text: str, stage: str) -> str:
        return next(line for line in text.splitlines() if f" videogrpo stage {stage} " in line)

    recipe = dry("--configfile", "config/recipes/rl_5b_cps.yaml")
    key = f"{tmp_path}/kernels/kernels-community--flash-attn3@{COMMIT[:12]}"
    assert "rule fetch_kernel:" in recipe and "videogrpo stage fetch-kernel --config-json" in recipe
    assert f"--kernel-cache {key}/cache " in command(recipe, "train")
    assert f"--kernel-cache {key}/cache --kernel-manifest {key}/fetch_kernel.manifest.json" in command(
        recipe, "preflight"
    )
    offline = f"Shell command: KERNELS_CACHE={key}/cache HF_HUB_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1 videogrpo stage "
    cells = [line for line in recipe.splitlines() if " videogrpo stage generate-cell " in line]
    assert len(cells) == 2 and all(line.startswith(offline) for line in cells)  # the recipe's check pair
    (tmp_path / "fa3.yaml").write_text("parallel:\n  attention_backend: _flash_3_hub\n")
    tiny_fa3 = dry("--configfile", str(tmp_path / "fa3.yaml"))
    cells = [line for line in tiny_fa3.splitlines() if " videogrpo stage generate-cell " in line]
    assert len(cells) == len(CELLS) and all(line.startswith(offline) for line in cells)
    default = dry()
    assert "fetch_kernel" not in default and "KERNELS_CACHE" not in default


def test_diffusers_loads_the_pinned_kernel_offline_through_the_kernels_package(tmp_path):
    """diffusers' own loader (what set_attention_backend("_flash_3_hub") calls: kernels.get_kernel(repo,
    version=1)) with HF_HUB_OFFLINE=1 and KERNELS_CACHE as training sets them. The CUDA variants cannot load on
    CPU, so the stand-in also holds a CPU variant with the functions diffusers looks up: it is loaded from the
    pinned snapshot. Needs the kernels package (the GPU environment has it; the CPU one does not)."""
    pytest.importorskip("kernels")
    files = stand_in()
    cpu = "build/torch-cpu"
    files[f"{cpu}/__init__.py"] = (
        b"from . import flash_attn_interface\nfrom .flash_attn_interface import flash_attn_func\n"
    )
    files[f"{cpu}/flash_attn_interface.py"] = (
        b"def flash_attn_func(*a, **k):\n    return 'stand-in'\n"
        b"def _flash_attn_forward(*a, **k):\n    return 'forward'\n"
        b"def _flash_attn_backward(*a, **k):\n    return 'backward'\n"
    )
    metadata = {"name": "flash-attn3", "id": "_flash_attn3_cpu_5e6f7a8", "version": 1, "license": "bsd-3-clause"}
    files[f"{cpu}/metadata.json"] = json.dumps(dict(metadata, **{"python-depends": [], "backend": {"type": "cpu"}}))
    files[f"{cpu}/metadata.json"] = files[f"{cpu}/metadata.json"].encode()
    with HubServer({("kernel", REPO_ID): {COMMIT: files}}) as hub:
        assert fetch(hub.endpoint, tmp_path / "cache", tmp_path / "m.json").returncode == 0
    code = (
        "from diffusers.models import attention_dispatch as ad\n"
        "ad._maybe_download_kernel_for_backend(ad.AttentionBackendName._FLASH_3_HUB)\n"
        "entry = ad._HUB_KERNELS_REGISTRY[ad.AttentionBackendName._FLASH_3_HUB]\n"
        "import sys; module = sys.modules[entry.kernel_fn.__module__]\n"
        "print(entry.kernel_fn(), entry.wrapped_forward_fn(), module.__file__)\n"
    )
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as a shell may not set it
    env = dict(inherited, HF_ENDPOINT="http://127.0.0.1:9", **ak.loader_env(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    kernel_fn, forward, module = result.stdout.split()
    assert (kernel_fn, forward) == ("stand-in", "forward")
    snapshot = (tmp_path / "cache" / f"kernels--kernels-community--flash-attn3/snapshots/{COMMIT}").resolve()
    assert Path(module) == snapshot / cpu / "flash_attn_interface.py"
    # Loading it wrote nothing into the cache (no __pycache__): it is still what fetch_kernel recorded.
    assert ak.cache_problems(tmp_path / "cache", json.loads((tmp_path / "m.json").read_text()), REPO_ID, COMMIT) == []
    # The per-node launcher's load check takes the same path and names the file it loaded.
    hub_cfg = Config(parallel=ParallelConfig(attention_backend="_flash_3_hub"))
    ok, detail = ak.load_check(hub_cfg, tmp_path / "cache", "n")
    assert ok and detail.endswith(str(snapshot / cpu / "flash_attn_interface.py")), detail


@pytest.mark.e2e
def test_snakemake_fetches_the_kernel_of_a_hub_backend_and_a_rerun_does_nothing(tmp_path):
    """Real snakemake in a fresh copy of the checkout, the loopback Hub as HF_ENDPOINT, the tiny default with
    the recipes' attention backend, targeting fetch_kernel's manifest."""
    import yaml
    from demo import copy_checkout, run

    checkout = copy_checkout(tmp_path / "checkout")
    (checkout / "fa3.yaml").write_text(yaml.safe_dump({"parallel": {"attention_backend": "_flash_3_hub"}}))
    key = f"results/kernels/kernels-community--flash-attn3@{COMMIT[:12]}"
    command = ["snakemake", f"{key}/fetch_kernel.manifest.json", "--cores", "1", "--configfile", "fa3.yaml"]
    files = stand_in()
    with HubServer({("kernel", REPO_ID): {COMMIT: files}}) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
        first = run(command, checkout, **env)
        again = run([*command, "-n"], checkout, **env)
    assert "fetch_kernel" in first.stderr and "Nothing to be done" in again.stdout + again.stderr
    manifest = json.loads((checkout / key / "fetch_kernel.manifest.json").read_text())
    snapshot = f"kernels--kernels-community--flash-attn3/snapshots/{COMMIT}"
    assert set(manifest["outputs"]["kernel"]["entries"]) == {
        f"{snapshot}/{name}" for name in files if name.startswith("build/")
    } | {"kernels--kernels-community--flash-attn3/refs/v1"}
    assert check_attention_kernel(
        kernel_cfg(), checkout / key / "cache", checkout / key / "fetch_kernel.manifest.json"
    ).ok


@pytest.mark.parametrize("with_kernel", [True, False])
def test_the_training_workers_get_the_kernel_cache_and_offline_mode_only_with_a_kernel(
    monkeypatch, tmp_path, with_kernel
):
    """train_this_node's torchrun environment: KERNELS_CACHE (absolute) and HF_HUB_OFFLINE=1 with --kernel-cache,
    neither without (the environment of the driver is passed on as it is)."""
    import contextlib

    from videogrpo.launch import node

    started = {}
    monkeypatch.delenv("KERNELS_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setattr(node.preflight, "node_checks", lambda cfg, port=None, **_: [])
    monkeypatch.setattr(node, "judge_service", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(
        node.subprocess,
        "run",
        lambda argv, env, check, **_: started.update(argv=argv, env=env) or subprocess.CompletedProcess(argv, 0),
    )
    monkeypatch.chdir(tmp_path)
    cfg = Config(parallel=ParallelConfig(nodes=1, procs_per_node=1, device="cpu", backend="gloo"))
    job = node.NodeTraining(
        config_json="{}",
        run_id="r",
        run_dir=tmp_path / "run",
        model=tmp_path / "model",
        dataset=tmp_path / "data",
        final=tmp_path / "final",
        metrics=tmp_path / "m.jsonl",
        input_digests={},
        kernel_cache=Path("kernels/x/cache") if with_kernel else None,
    )
    node.train_this_node(cfg, job)
    assert "videogrpo.grpo.worker" in started["argv"]
    env = started["env"]
    if with_kernel:
        assert env["KERNELS_CACHE"] == str((tmp_path / "kernels/x/cache").resolve()) and env["HF_HUB_OFFLINE"] == "1"
        assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # importing the kernel writes no __pycache__ into the cache
    else:
        assert "KERNELS_CACHE" not in env and "HF_HUB_OFFLINE" not in env
    assert env["OMP_NUM_THREADS"] == str(cfg.parallel.cpu_threads)


def test_a_diffusers_that_asks_for_another_kernel_version_is_told_to_fetch_again(copy, monkeypatch):
    """The cache's ref is the version the diffusers of the fetch asked for; another diffusers finds no ref."""
    cache, manifest = copy
    monkeypatch.setattr(ak, "registry_entry", lambda backend: (REPO_ID, None, 2))
    check = check_attention_kernel(kernel_cfg(), cache, manifest)
    assert not check.ok
    assert "no ref of version 2" in check.detail and "snakemake --forcerun fetch_kernel" in check.detail


def test_only_a_cuda_machine_with_kernels_can_refuse_the_build_variants_and_it_does():
    variants = list(VARIANTS)
    assert ak.variant_verdict(variants, VARIANTS[1], True, True) == (
        True,
        f"kernels picks build variant {VARIANTS[1]} here",
    )
    ok, why = ak.variant_verdict(variants, None, True, True)
    assert not ok and f"no build variant for this machine's torch and CUDA among {variants}" in why
    assert "envs/gpu.txt" in why and "parallel.attention_kernel_repo" in why
    assert ak.variant_verdict(variants, None, False, True)[0] and ak.variant_verdict(variants, None, True, False)[0]
    assert "not installed here" in ak.variant_verdict(variants, None, False, True)[1]
    assert "no CUDA here" in ak.variant_verdict(variants, None, True, False)[1]


def test_preflight_on_a_gpu_node_refuses_a_kernel_without_a_variant_for_its_torch(copy, monkeypatch):
    """What a GPU node with kernels installed sees when the pinned revision has no build for its torch/CUDA
    (kernels' own variant choice, probed on that node, made to find none here)."""
    import videogrpo.preflight.checks as pf

    cache, manifest = copy
    monkeypatch.setattr(pf, "_cuda_visible", lambda: True)
    monkeypatch.setattr(ak, "build_variants", lambda snapshot: (sorted(VARIANTS), None))
    monkeypatch.setattr(ak, "kernels_installed", lambda: True)
    cfg = kernel_cfg()
    cfg.parallel.device = "cuda"
    check = check_attention_kernel(cfg, cache, manifest)
    assert not check.ok and "kernels finds no build variant for this machine's torch and CUDA" in check.detail


def test_the_per_node_load_check_runs_diffusers_loader_offline_and_names_the_failure(tmp_path):
    """What each node's launcher runs on CUDA with a Hub backend: diffusers' loader in a child process with the
    loader environment. Here (no kernels package, no CUDA variant) it must fail naming the node, the cache and why;
    with no cache at all it names the missing argument."""
    cfg = Config(parallel=ParallelConfig(attention_backend="_flash_3_hub", device="cuda"))
    ok, detail = ak.load_check(cfg, None, "gpu-07")
    assert not ok and detail.startswith("gpu-07:") and "--kernel-cache" in detail
    files = stand_in()
    with HubServer({("kernel", REPO_ID): {COMMIT: files}}) as hub:
        assert fetch(hub.endpoint, tmp_path / "cache", tmp_path / "m.json").returncode == 0
    ok, detail = ak.load_check(cfg, tmp_path / "cache", "gpu-07")
    assert not ok, detail
    assert detail.startswith(f"gpu-07: the _flash_3_hub kernel does not load offline from {tmp_path / 'cache'}: ")
    assert "rerun fetch_kernel" in detail
