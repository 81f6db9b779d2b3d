"""The scorer's own environment (evalkit.python): what its processes import, and what the runtime check refuses.

Scorer interpreters here are venvs whose own site-packages come before the driver's (as `make scorer-env` builds one
beside the driver's); `make_scorer_venv` builds them.
"""

import ast
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from videogrpo.data.dataset import load_split
from videogrpo.errors import VideoGRPOError
from videogrpo.provenance.digest import evalkit_source_digest
from videogrpo.rewards.evalkit import EVALKIT_MODULE_IMPORTS, EVALKIT_MODULES
from videogrpo.rewards.rule import RuleScorer, ScoreRequest
from videogrpo.rewards.scorer_process import check_runtime

from conftest import REPO


def request(sample, frames):
    return ScoreRequest(frames, sample.task, str(sample.directory), 16, 128, 5.0, 12, 0.0)


def make_scorer_venv(root: Path) -> tuple[Path, Path]:
    """A venv (its python, its own site-packages) whose own site-packages come first, the driver's after them (a
    .pth adds them: numpy, av, PIL, cv2, videogrpo): a scorer interpreter that can differ from the driver's."""
    import site

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin/python"
    where = [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    own = Path(subprocess.run(where, capture_output=True, text=True, check=True).stdout.strip())
    driver = "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
    (own / "zz_driver.pth").write_text(driver)  # after its own site-packages, as .pth files are read
    return python, own


@pytest.fixture(scope="session")
def scorer_python(tmp_path_factory):
    """A scorer interpreter whose packages differ from the driver's, as a `make scorer-env` venv does: a module only
    it has (scorer_only_mod) and another version of a package the driver has too (idna 99.0)."""
    python, own = make_scorer_venv(tmp_path_factory.mktemp("scorer-venv"))
    (own / "scorer_only_mod.py").write_text("HERE = True\n")
    (own / "idna").mkdir()
    (own / "idna/__init__.py").write_text('__version__ = "99.0"\n')
    (own / "idna-99.0.dist-info").mkdir()
    (own / "idna-99.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: idna\nVersion: 99.0\n")
    return python


def test_scorer_workers_run_under_the_configured_interpreter(evalkit, tmp_path, dataset):
    """evalkit.python: the scorer's own environment (here a wrapper that marks its processes)."""
    wrapper = tmp_path / "scorer-python"
    wrapper.write_text(f'#!/bin/sh\nexport SCORER_ENV_MARKER=scorer-env\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    (kit / "run_evaluation.py").write_text(
        "import os\n\n\ndef evaluate_single_video(video_path, task_name, gt_info=None, device='cuda'):\n"
        "    return {'score': 0.5, 'dimensions': {'env': os.environ.get('SCORER_ENV_MARKER')}}\n"
    )
    sample = load_split(dataset, "rl")[0]
    frames = np.zeros((5, 64, 64, 3), np.uint8)
    with RuleScorer(kit, workers=1, threads_per_worker=1, python=str(wrapper)) as pool:
        marked = pool.submit(request(sample, frames)).result()
    assert marked["dimensions"]["env"] == "scorer-env"
    with RuleScorer(kit, workers=1, threads_per_worker=1) as pool:  # the default again: this interpreter
        plain = pool.submit(request(sample, frames)).result()
    assert plain["dimensions"]["env"] is None
    record = check_runtime({"numpy": np.__version__}, python=str(wrapper))
    assert record["python"] == str(wrapper) and record["imports"] == {"numpy": "ok"}


SCORER_ENV_PROBE = """import os, sys

import idna
import scorer_only_mod
from vbvr_bench.evaluators import TASK_EVALUATOR_MAP


def evaluate_single_video(video_path, task_name, gt_info=None, device="cuda"):
    return {"score": 0.5, "dimensions": {"idna": idna.__version__, "idna_at": idna.__file__,
                                         "only_at": scorer_only_mod.__file__, "prefix": sys.prefix}}
"""


def scorer_env_kit(evalkit, tmp_path) -> Path:
    """The reference EvalKit whose evaluators import, at module level, what only the scorer interpreter has (as
    the real ones import cv2), in the checkout with CUDA hidden, and whose entry point reports what it sees."""
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    registry = kit / "vbvr_bench/evaluators/__init__.py"
    registry.write_text(
        "import os\n\nimport scorer_only_mod  # noqa: F401\n\n"
        "assert os.environ['CUDA_VISIBLE_DEVICES'] == '', 'CUDA is visible to the evaluators'\n"
        "open('annotations/tasks.json').close()  # relative to the checkout\n" + registry.read_text()
    )
    (kit / "run_evaluation.py").write_text(SCORER_ENV_PROBE)
    return kit


def test_scorer_workers_import_the_scorer_interpreters_packages(scorer_python, evalkit, tmp_path, dataset):
    """The workers, the runtime probe of check_scorer_runtime and the per-worker re-check all see the scorer
    interpreter's own packages: its module, its idna, not the driver's (multiprocessing's spawn sent the
    driver's sys.path: the probe passed while the workers imported the driver's packages)."""
    kit = scorer_env_kit(evalkit, tmp_path)
    venv = str(scorer_python.parent.parent)
    mine = {"idna": "99.0"}
    assert check_runtime(mine, python=str(scorer_python), checkout=kit)["found"] == mine
    sample = load_split(dataset, "rl")[0]
    frames = np.zeros((5, 64, 64, 3), np.uint8)
    with RuleScorer(kit, workers=2, threads_per_worker=1, runtime=mine, python=str(scorer_python)) as pool:
        seen = [r["dimensions"] for r in pool.collect([pool.submit(request(sample, frames)) for _ in range(2)])]
    for worker in seen:
        assert worker["idna"] == "99.0" and worker["idna_at"].startswith(venv) and worker["only_at"].startswith(venv)
        assert worker["prefix"] == venv
    drivers = {"idna": metadata.version("idna")}  # the probe and the workers refuse it alike
    with pytest.raises(VideoGRPOError, match=f"idna: contract {drivers['idna']}, found 99.0"):
        check_runtime(drivers, python=str(scorer_python), checkout=kit)
    with pytest.raises(VideoGRPOError, match=f"could not start .*idna: contract {drivers['idna']}, found 99.0"):
        RuleScorer(kit, workers=1, threads_per_worker=1, runtime=drivers, python=str(scorer_python))


def test_preflight_lists_the_tasks_with_the_scorer_interpreter(scorer_python, evalkit, dataset, tmp_path, monkeypatch):
    """Preflight imports the evaluators as a scorer worker does: evalkit.python, in the checkout, CUDA hidden."""
    from videogrpo import config
    from videogrpo.preflight.checks import check_evalkit_tasks

    kit = scorer_env_kit(evalkit, tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the driver sees a GPU; the evaluators must not
    monkeypatch.chdir(tmp_path)

    def kit_config(**evalkit_fields):
        fields = {"path": str(kit), "digest": evalkit_source_digest(kit), **evalkit_fields}
        return config.from_dict({"evalkit": fields}, partial=True)

    ok = check_evalkit_tasks(kit_config(python=str(scorer_python)), dataset)
    assert ok.ok and "3 of 3 dataset tasks have an evaluator" in ok.detail, ok.detail
    without = check_evalkit_tasks(kit_config(), dataset)  # the driver's interpreter has no scorer_only_mod
    assert not without.ok and "No module named 'scorer_only_mod'" in without.detail, without.detail


def test_a_scorer_interpreter_that_cannot_run_the_worker_is_named_with_the_fix(evalkit, tmp_path, monkeypatch):
    """evalkit.python missing, or an environment without videogrpo (its `-e .` forgotten): the cause and the fix,
    from the process's own last lines."""
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the scorer processes inherit it: no videogrpo from there
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(VideoGRPOError, match=r"(?s)No module named 'videogrpo'.*has videogrpo installed"):
        RuleScorer(evalkit, workers=1, threads_per_worker=1, python=str(bare / "bin/python"))
    with pytest.raises(VideoGRPOError, match=r"evalkit.python = '/nonexistent/python' cannot be run"):
        check_runtime({}, python="/nonexistent/python")


def pinned_distributions(requirements: Path) -> set[str]:
    """The distributions a requirements file pins (`name==version` lines), by their canonical names."""
    names = set()
    for line in requirements.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            names.add(re.sub(r"[-_.]+", "-", line.split("==")[0].strip()).lower())
    return names


@pytest.mark.parametrize("requirements", ["envs/scorer.txt", "envs/cpu.txt", "envs/gpu.lock.txt"])
def test_the_scorer_environments_provide_every_module_the_evalkit_imports_at_module_level(requirements):
    """envs/scorer.txt (evalkit.python of the recipes), envs/cpu.txt (whose interpreter scores the tiny default) and
    the GPU environment's lock (bench/gpu_smoke.py scores with the stand-in there) pin a distribution of each module,
    found where this interpreter imports it from."""
    pinned = pinned_distributions(REPO / requirements)
    providers = metadata.packages_distributions()
    for module in EVALKIT_MODULES:
        assert module in providers, f"this environment cannot import {module}: envs/cpu.txt must provide it"
        names = {re.sub(r"[-_.]+", "-", name).lower() for name in providers[module]}
        assert names & pinned, f"{requirements} pins no distribution of {module} (one of {sorted(names)})"


def module_level_imports(path: Path) -> set[str]:
    """The top-level packages a Python file imports at module level (not inside a function)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_the_stand_in_evalkit_imports_at_module_level_what_the_public_one_imports(evalkit):
    """Where the public EvalKit imports a module at module level, the stand-in does too (every evaluator module for
    the evaluators' folder), so the tiny default meets an environment as the real EvalKit does."""
    for where, modules in EVALKIT_MODULE_IMPORTS.items():
        files = (
            [p for p in sorted((evalkit / where).glob("*.py")) if p.name != "__init__.py"]
            if where.endswith("/")
            else [evalkit / where]
        )
        assert files, f"the stand-in EvalKit has no {where}"
        for path in files:
            missing = set(modules) - module_level_imports(path)
            assert not missing, f"{path.relative_to(evalkit)} does not import {sorted(missing)} at module level"


HIDE_MODULE = """import sys


class HideModule:
    \"\"\"An interpreter that never installed one module: importing it fails as a missing module fails.\"\"\"

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == {module!r} or name.startswith({module!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, HideModule)
"""


@pytest.mark.parametrize("module", EVALKIT_MODULES)
def test_a_scorer_environment_without_a_module_the_evalkit_imports_is_refused_naming_it_and_the_fix(
    evalkit, tmp_path, module
):
    """check_scorer_runtime's probe and every scorer process's start refuse an interpreter that cannot import one of
    the EvalKit's module-level imports, naming the module and `make scorer-env`, before any EvalKit code runs."""
    python, own = make_scorer_venv(tmp_path / "venv")
    (own / "hide_module.py").write_text(HIDE_MODULE.format(module=module))
    (own / "aa_hide_module.pth").write_text("import hide_module\n")
    hidden = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    assert f"ModuleNotFoundError: No module named '{module}'" in hidden.stderr  # the venv really lacks it
    fix = (
        f"import {module} fails (ModuleNotFoundError: No module named '{module}'): the public EvalKit imports "
        f"{module} at module level"
    )
    with pytest.raises(VideoGRPOError) as probe:
        check_runtime({}, python=str(python), checkout=evalkit)
    with pytest.raises(VideoGRPOError) as start:
        RuleScorer(evalkit, workers=1, threads_per_worker=1, python=str(python))
    for err in (probe, start):
        message = str(err.value)
        assert fix in message and "`make scorer-env` (envs/scorer.txt lists it)" in message, message
    assert "could not start" in str(start.value)
    record = check_runtime({}, python=sys.executable, checkout=evalkit)  # this environment has every one
    assert record["evalkit_imports"] == {m: "ok" for m in EVALKIT_MODULES}
