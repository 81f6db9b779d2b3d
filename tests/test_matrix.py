"""The evaluation matrix's stages through their CLI: the evaluation set's exact set and pin, validated hub
models, generation (resumed after SIGKILL, data parallel), scoring that keeps every error, aggregates."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from videogrpo.data.video import write_mp4
from videogrpo.demo.synthetic_eval_tree import write_synthetic_tree
from videogrpo.errors import DigestMismatch
from videogrpo.evaluation.aggregate import bootstrap_interval, matrix_table, summarize
from videogrpo.evaluation.evalset import EvalSample, EvalSetError, eval_samples, load_samples
from videogrpo.evaluation.generate import Settings, output_problems
from videogrpo.evaluation.pipelines import ModelRefused, validate_pipeline
from videogrpo.provenance.digest import evalkit_source_digest, sha256_file, tree_digest

from conftest import TASKS
from hub_server import HubServer, files_of

BIN = Path(sys.executable).parent
SETTINGS = Settings(steps=4, guidance_scale=1.0, seed=0, num_frames=17, height=64, width=64, fps=16)
MATRIX = {"expected_samples": 6, "seed": 0, "bootstrap": 100}
# The generated videos' shape and frame rate, which score-cell reads too (the training run's: video.*).
VIDEO = {"video": {"num_frames": 17, "height": 64, "width": 64, "fps": 16}}
# What a generate-cell invocation reads besides the matrix section (tiny model, CPU, one thread, 4 steps).
GENERATION = {
    **VIDEO,
    "grpo": {"sampling_steps": 4},
    "model": {"source": "tiny", "repo_id": "", "revision": "", "max_text_tokens": 64},
    "parallel": {
        "device": "cpu",
        "backend": "gloo",
        "attention_backend": "native",
        "cpu_threads": 1,
        "param_dtype": "float32",
    },
}


def stage(name: str, sections: dict, *args: str, check: bool = True, wait: bool = True, **env: str):
    command = [str(BIN / "videogrpo"), "stage", name, "--config-json", json.dumps(sections), *args]
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", **env)
    if not wait:
        return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = subprocess.run(command, env=environment, capture_output=True, text=True)
    if check and out.returncode:
        raise AssertionError(f"{name} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("evalset") / "tree"
    write_synthetic_tree(root, TASKS, 2, seed=0, frames=17, height=64, width=64, fps=16)
    return root


@pytest.fixture(scope="module")
def evalset(tree, tmp_path_factory) -> Path:
    """eval_set run on the synthetic tree, pinned by its digest: samples.json and final frames."""
    out = tmp_path_factory.mktemp("evalset-out")
    sections = {"matrix": dict(MATRIX, eval_set=str(tree), eval_set_digest=tree_digest(tree))}
    stage(
        "eval-set",
        sections,
        "--tree",
        str(tree),
        "--samples",
        str(out / "samples.json"),
        "--final-frames",
        str(out / "final_frames"),
        "--manifest",
        str(out / "eval_set.manifest.json"),
    )
    return out


def copy_tree(tree: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tree, tmp_path / "tree"))


def test_the_synthetic_tree_is_the_exact_set_in_release_order(tree):
    samples = eval_samples(tree, 6)
    assert [s.name for s in samples] == [
        f"In-Domain_50/{TASKS[0]}/00000",
        f"In-Domain_50/{TASKS[0]}/00001",
        f"In-Domain_50/{TASKS[1]}/00000",
        f"In-Domain_50/{TASKS[1]}/00001",
        f"Out-of-Domain_50/{TASKS[2]}/00000",
        f"Out-of-Domain_50/{TASKS[2]}/00001",
    ]
    assert [s.index for s in samples] == list(range(6))
    manifest = json.loads((tree / "split_manifest.json").read_text())
    assert [s.sample_id for s in samples[:2]] == manifest[0]["bench"]


def _edit_manifest(root: Path, change) -> None:
    records = json.loads((root / "split_manifest.json").read_text())
    change(records)
    (root / "split_manifest.json").write_text(json.dumps(records))


CORRUPTIONS = {
    "missing sample": (
        lambda r: shutil.rmtree(r / f"In-Domain_50/{TASKS[0]}/00001"),
        f"In-Domain_50/{TASKS[0]}/00001: listed in split_manifest.json but not in the tree",
    ),
    "extra sample": (
        lambda r: shutil.copytree(r / f"In-Domain_50/{TASKS[0]}/00001", r / f"In-Domain_50/{TASKS[0]}/00002"),
        "00002: index beyond the task's 2 bench samples",
    ),
    "stray entry": (
        lambda r: (r / f"In-Domain_50/{TASKS[0]}/notes.txt").write_text("x"),
        "notes.txt: not a sample directory",
    ),
    "missing file": (lambda r: (r / f"In-Domain_50/{TASKS[1]}/00000/prompt.txt").unlink(), "missing prompt.txt"),
    "metadata of another sample": (
        lambda r: shutil.copy(
            r / f"In-Domain_50/{TASKS[0]}/00000/metadata.json", r / f"In-Domain_50/{TASKS[0]}/00001/metadata.json"
        ),
        "metadata.json task_id",
    ),
    "duplicate sample id": (
        lambda r: _edit_manifest(r, lambda m: m[0].update(bench=[m[0]["bench"][0]] * 2)),
        "lists sample ids twice",
    ),
    "duplicate task": (lambda r: _edit_manifest(r, lambda m: m.append(dict(m[0]))), "is listed twice"),
    "task not in the manifest": (lambda r: _edit_manifest(r, lambda m: m.pop(1)), "task absent from split_manifest"),
    "task in the wrong domain": (
        lambda r: shutil.move(r / f"Out-of-Domain_50/{TASKS[2]}", r / f"In-Domain_50/{TASKS[2]}"),
        "the manifest assigns this task to Out-of-Domain_50",
    ),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_a_tree_that_is_not_the_manifests_exact_set_is_refused_naming_the_sample(tree, tmp_path, case):
    root = copy_tree(tree, tmp_path)
    corrupt, message = CORRUPTIONS[case]
    corrupt(root)
    with pytest.raises(EvalSetError) as err:
        eval_samples(root, 6)
    assert message in str(err.value)


def test_a_count_other_than_the_expected_one_is_refused(tree):
    with pytest.raises(EvalSetError, match="6 samples, expected exactly 500"):
        eval_samples(tree, 500)


@pytest.mark.parametrize("edited", ["split_manifest.json", f"In-Domain_50/{TASKS[0]}/00000/prompt.txt"])
def test_a_tampered_tree_or_manifest_is_refused_against_its_pin(tree, tmp_path, edited):
    root = copy_tree(tree, tmp_path)
    pinned = tree_digest(root)
    target = root / edited
    target.write_bytes(target.read_bytes().replace(b"0", b"1") + b" ")
    sections = {"matrix": dict(MATRIX, eval_set=str(root), eval_set_digest=pinned)}
    out = stage(
        "eval-set",
        sections,
        "--tree",
        str(root),
        "--samples",
        str(tmp_path / "samples.json"),
        "--final-frames",
        str(tmp_path / "ff"),
        "--manifest",
        str(tmp_path / "m.json"),
        check=False,
    )
    assert out.returncode != 0
    assert f"matrix.eval_set_digest pins {pinned}" in out.stderr and tree_digest(root) in out.stderr
    assert not (tmp_path / "samples.json").exists() and not (tmp_path / "m.json").exists()


def test_a_file_changed_after_the_pin_is_refused_by_the_stage_reading_it(evalset, tree, tmp_path):
    tree_of, samples = load_samples(evalset / "samples.json", check=("first_frame.png", "prompt.txt"))
    assert tree_of == tree.resolve() and len(samples) == 6
    frame = tree / samples[3].name / "first_frame.png"
    original = frame.read_bytes()
    try:
        frame.write_bytes(original + b"\0")
        with pytest.raises(DigestMismatch, match="first_frame.png: changed since eval_set recorded it"):
            load_samples(evalset / "samples.json", check=("first_frame.png",))
    finally:
        frame.write_bytes(original)


def _videos(root: Path, samples: list[EvalSample], frames=17, side=64, fps=16) -> None:
    rng = np.random.default_rng(0)
    for s in samples:
        (root / s.name).parent.mkdir(parents=True, exist_ok=True)
        write_mp4(root / f"{s.name}.mp4", rng.integers(0, 255, (frames, side, side, 3), dtype=np.uint8), fps=fps)


OUTPUT_DEFECTS = {
    "missing": (lambda root, s: (root / f"{s[0].name}.mp4").unlink(), "missing {0}.mp4"),
    "extra": (
        lambda root, s: shutil.copy(root / f"{s[0].name}.mp4", root / "In-Domain_50/x.mp4"),
        "extra In-Domain_50/x.mp4",
    ),
    "wrong size": (lambda root, s: _videos(root, s[:1], side=32), "invalid {0}.mp4: size=32x32, expected=64x64"),
    "wrong frame count": (lambda root, s: _videos(root, s[:1], frames=13), "invalid {0}.mp4: frames=13, expected=17"),
    "wrong fps": (lambda root, s: _videos(root, s[:1], fps=8), "invalid {0}.mp4: fps=8, expected=16"),
    "undecodable": (lambda root, s: (root / f"{s[0].name}.mp4").write_bytes(b"not a video"), "video decode failed"),
    "duplicate": (None, "the evaluation list names {0}.mp4 twice"),
}


@pytest.mark.parametrize("case", OUTPUT_DEFECTS)
def test_a_cells_videos_must_be_the_exact_set(tree, tmp_path, case):
    samples = eval_samples(tree, 6)
    _videos(tmp_path, samples)
    (tmp_path / f".{samples[1].sample}.tmp-rank0-pid1.mp4").write_bytes(b"")  # a temporary: not an output
    assert output_problems(tmp_path, samples, SETTINGS) == []
    defect, message = OUTPUT_DEFECTS[case]
    if defect is None:
        samples = samples + samples[:1]
    else:
        defect(tmp_path, samples)
    problems = output_problems(tmp_path, samples, SETTINGS)
    assert any(message.format(samples[0].name) in p for p in problems), problems


def generate_args(evalset: Path, tiny_model: Path, out: Path, sampler: str) -> list[str]:
    return [
        "--model",
        str(tiny_model),
        "--samples",
        str(evalset / "samples.json"),
        "--sampler",
        sampler,
        "--videos",
        str(out / "videos"),
        "--work",
        str(out / "work"),
        "--manifest",
        str(out / "m.json"),
    ]


def test_an_interrupted_generation_resumes_with_the_videos_it_lacks(evalset, tiny_model, tmp_path):
    """SIGKILL once two videos exist; the rerun keeps them (same files) and makes the others; the cell equals
    one made in one go by two data-parallel processes, byte for byte (noise is keyed by sample)."""
    sections = {**GENERATION, "matrix": dict(MATRIX, procs=1)}
    killed = tmp_path / "killed"
    process = stage("generate-cell", sections, *generate_args(evalset, tiny_model, killed, "flowcps-0.7"), wait=False)
    deadline = time.monotonic() + 240
    while len(list((killed / "work").rglob("[0-9]*.mp4"))) < 2:
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    kept = {p.relative_to(killed / "work"): p.stat().st_ino for p in (killed / "work").rglob("[0-9]*.mp4")}
    assert 2 <= len(kept) < 6 and not (killed / "videos").exists() and not (killed / "m.json").exists()
    out = stage("generate-cell", sections, *generate_args(evalset, tiny_model, killed, "flowcps-0.7"))
    videos = sorted(p.relative_to(killed / "videos") for p in (killed / "videos").rglob("*.mp4"))
    assert len(videos) == 6 and not list((killed / "videos").rglob(".*")), out.stdout
    key = next(iter(kept)).parts[0]
    for rel, inode in kept.items():  # not generated again
        assert (killed / "videos" / Path(*rel.parts[2:])).stat().st_ino == inode
    assert not (killed / "work").exists() or not any((killed / "work").iterdir()), key
    parallel = tmp_path / "parallel"
    stage(
        "generate-cell",
        {**GENERATION, "matrix": dict(MATRIX, procs=2)},
        *generate_args(evalset, tiny_model, parallel, "flowcps-0.7"),
    )
    for rel in videos:
        assert sha256_file(parallel / "videos" / rel) == sha256_file(killed / "videos" / rel), rel
    manifest = json.loads((killed / "m.json").read_text())
    assert manifest["summary"] == {"sampler": "flowcps-0.7", "videos": 6}
    assert manifest["inputs"]["samples"]["sha256"] == sha256_file(evalset / "samples.json")


def test_the_ode_samplers_are_deterministic_and_differ(evalset, tiny_model, tmp_path):
    sections = {**GENERATION, "matrix": MATRIX}
    digests = {}
    for sampler in ("euler", "unipc", "flowcps-0.0"):
        stage("generate-cell", sections, *generate_args(evalset, tiny_model, tmp_path / sampler, sampler))
        digests[sampler] = tree_digest(tmp_path / sampler / "videos")
    assert len(set(digests.values())) == 3
    stage("generate-cell", sections, *generate_args(evalset, tiny_model, tmp_path / "again", "unipc"))
    assert tree_digest(tmp_path / "again" / "videos") == digests["unipc"]


def _hub_pipeline(tiny_model: Path, code: bytes) -> dict[str, bytes]:
    files = files_of(tiny_model)
    files["pipeline.py"] = code
    return files


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned pipeline.py", "other pipeline.py"])
def test_a_hub_model_is_accepted_only_with_the_pinned_pipeline_code(tiny_model, tmp_path, pinned):
    code = b"class VBVRPipeline:  # reviewed\n    pass\n"
    commit = "0123456789abcdef0123456789abcdef01234567"
    pin = __import__("hashlib").sha256(code if pinned else b"other").hexdigest()
    out = tmp_path / "rule_rl" / "pipeline"
    with HubServer({("model", "org/rl"): {commit: _hub_pipeline(tiny_model, code)}}) as hub:
        done = stage(
            "fetch-eval-model",
            {"matrix": {"pipeline_sha256": pin}},
            "--name",
            "rule_rl",
            "--spec",
            f"org/rl@{commit}",
            "--out",
            str(out),
            "--manifest",
            str(tmp_path / "m.json"),
            check=False,
            HF_ENDPOINT=hub.endpoint,
            HF_HOME=str(tmp_path / "hf"),
            HF_HUB_DISABLE_TELEMETRY="1",
        )
    if pinned:
        assert done.returncode == 0, done.stderr
        summary = json.loads((tmp_path / "m.json").read_text())["summary"]
        assert summary["validation"]["pipeline_sha256"] == pin and summary["validation"]["weights_loaded"] is False
        assert summary["validation"]["shapes"]["transformer"]["shapes"] == "as its config implies"
        assert "transformer" in summary["validation"]["components"]
    else:
        assert done.returncode != 0
        assert "pipeline.py: custom pipeline code with SHA-256" in done.stderr and pin in done.stderr
        assert not out.exists() and not (tmp_path / "m.json").exists()


def test_a_corrupt_safetensors_header_or_missing_component_is_refused(tiny_model, tmp_path):
    model = Path(shutil.copytree(tiny_model, tmp_path / "m"))
    assert validate_pipeline(model, "0" * 64, load=False)["pipeline_sha256"] is None
    weights = next((model / "vae").glob("*.safetensors"))
    weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    with pytest.raises(ModelRefused, match="vae/.*: a header of .* bytes: truncated, or not a safetensors file"):
        validate_pipeline(model, "0" * 64, load=False)
    shutil.rmtree(model / "vae")
    with pytest.raises(ModelRefused, match="components without a directory: \\['vae'\\]"):
        validate_pipeline(model, "0" * 64, load=False)


def score_args(evalset: Path, videos: Path, out: Path, evalkit: Path, final_frames: Path | None = None) -> list[str]:
    return [
        "--videos",
        str(videos),
        "--samples",
        str(evalset / "samples.json"),
        "--final-frames",
        str(final_frames or evalset / "final_frames"),
        "--evalkit",
        str(evalkit),
        "--scores",
        str(out / "scores.csv"),
        "--aggregate",
        str(out / "aggregate.csv"),
        "--prepared",
        str(out / "prepared"),
        "--work",
        str(out / "work"),
        "--manifest",
        str(out / "m.json"),
    ]


SCORING = {
    "evalkit": {
        "workers": 2,
        "threads_per_worker": 1,
        "video_size": 128,
        "max_seconds": 5.0625,
        "runtime": [],
    }
}


def test_scoring_keeps_every_error_and_writes_scores_only_for_an_error_free_exact_set(evalset, tree, evalkit, tmp_path):
    _, samples = load_samples(evalset / "samples.json")
    _videos(tmp_path / "videos", samples)
    final_frames = Path(shutil.copytree(evalset / "final_frames", tmp_path / "ff"))
    (final_frames / f"{samples[2].name}.png").unlink()  # checked before the EvalKit, which would score without it
    sections = {**VIDEO, "evalkit": {**SCORING["evalkit"], "digest": evalkit_source_digest(evalkit)}, "matrix": MATRIX}
    out = tmp_path / "cell"
    failed = stage(
        "score-cell", sections, *score_args(evalset, tmp_path / "videos", out, evalkit, final_frames), check=False
    )
    assert failed.returncode != 0
    assert "1 of 6 samples have scorer errors" in failed.stderr and samples[2].name in failed.stderr
    # evalkit.fail_on_error is true (the default): the warning names the stage's own policy, not the field as false.
    assert "evalkit.fail_on_error is false" not in failed.stderr
    assert "scored 0.0 and recorded, whatever evalkit.fail_on_error says: score_cell scores every sample" in (
        failed.stderr
    )
    assert not (out / "scores.csv").exists() and not (out / "m.json").exists()
    records = {
        p.relative_to(out / "work").as_posix(): json.loads(p.read_text()) for p in (out / "work").rglob("*.json")
    }
    assert len(records) == 6
    errors = [r for r in records.values() if r["error"]]
    gone = (
        f"missing at scoring time: {(final_frames / f'{samples[2].name}.png').resolve()} (final frame, gt_final_frame)"
    )
    assert [r["name"] for r in errors] == [samples[2].name] and gone in errors[0]["error"]
    stage("score-cell", sections, *score_args(evalset, tmp_path / "videos", out, evalkit))
    scores = pd.read_csv(out / "scores.csv")
    assert sorted(scores["name"]) == sorted(s.name for s in samples) and scores.score.between(0, 1).all()
    prepared = sorted((out / "prepared").rglob("*.mp4"))
    assert len(prepared) == 6
    aggregate = pd.read_csv(out / "aggregate.csv")
    overall = aggregate[aggregate.level == "overall"].iloc[0]
    assert overall["samples"] == 6 and overall["mean"] == pytest.approx(scores.score.mean())


def _flaky_evalkit(evalkit: Path, dest: Path) -> tuple[Path, str]:
    """A copy of the EvalKit whose evaluators fail on a task while VG_TEST_FAIL_TASK names it (an outage the
    inputs do not show), and its source digest."""
    from videogrpo.provenance.digest import digest_length_prefixed, evalkit_files

    root = Path(shutil.copytree(evalkit, dest, ignore=shutil.ignore_patterns("__pycache__")))
    entry = root / "run_evaluation.py"
    entry.write_text(
        entry.read_text().replace(
            "    try:\n",
            "    try:\n        import os\n\n        if os.environ.get('VG_TEST_FAIL_TASK') == task_name:\n"
            "            raise OSError('scorer outage')\n",
            1,
        )
    )
    return root, digest_length_prefixed(root, evalkit_files(root))


def test_a_rerun_scores_again_the_samples_whose_record_holds_an_error(evalset, evalkit, tmp_path):
    """Same inputs, config and code: a record holding an error is not a result to keep, it is scored again."""
    _, samples = load_samples(evalset / "samples.json")
    _videos(tmp_path / "videos", samples)
    flaky, digest = _flaky_evalkit(evalkit, tmp_path / "evalkit")
    sections = {**VIDEO, "evalkit": {**SCORING["evalkit"], "digest": digest}, "matrix": MATRIX}
    out = tmp_path / "cell"
    args = score_args(evalset, tmp_path / "videos", out, flaky)
    failed = stage("score-cell", sections, *args, check=False, VG_TEST_FAIL_TASK=samples[0].task)
    assert failed.returncode != 0 and "scorer outage" in failed.stderr, failed.stderr[-3000:]
    failing = [s.name for s in samples if s.task == samples[0].task]
    kept = [json.loads(p.read_text()) for p in (out / "work").rglob("*.json")]
    assert sorted(r["name"] for r in kept if r["error"]) == sorted(failing), (kept, failed.stderr[-3000:])
    assert len(kept) == len(samples)
    stage("score-cell", sections, *args)
    scores = pd.read_csv(out / "scores.csv").set_index("name")
    assert sorted(scores.index) == sorted(s.name for s in samples)


def test_scoring_refuses_an_edited_first_frame_it_hands_to_the_evalkit(evalset, tree, evalkit, tmp_path):
    """gt_info names the first frame: score_cell checks it against samples.json like the other sample files."""
    _, samples = load_samples(evalset / "samples.json")
    _videos(tmp_path / "videos", samples)
    sections = {**VIDEO, "evalkit": {**SCORING["evalkit"], "digest": evalkit_source_digest(evalkit)}, "matrix": MATRIX}
    frame = tree / samples[1].name / "first_frame.png"
    original = frame.read_bytes()
    try:
        frame.write_bytes(original + b"\0")
        out = tmp_path / "cell"
        failed = stage(
            "score-cell",
            sections,
            *score_args(evalset, tmp_path / "videos", out, evalkit),
            check=False,
        )
    finally:
        frame.write_bytes(original)
    assert failed.returncode == 4, failed.stderr[-3000:]
    assert f"{frame}: changed since eval_set recorded it" in failed.stderr
    assert not (out / "scores.csv").exists() and not (out / "work").exists()


def test_a_sample_edited_while_scoring_ran_is_refused_and_scored_again_once_restored(tree, evalkit, tmp_path):
    """An EvalKit copy whose evaluator appends to a task's prompt.txt while it scores (an edit made during the
    run): the stage fails naming the file, the records of the edited samples are discarded, the others kept."""
    root = copy_tree(tree, tmp_path)
    evalset = tmp_path / "evalset"
    matrix = dict(MATRIX, eval_set=str(root), eval_set_digest=tree_digest(root))
    stage(
        "eval-set",
        {"matrix": matrix},
        *("--tree", str(root), "--samples", str(evalset / "samples.json")),
        *("--final-frames", str(evalset / "final_frames"), "--manifest", str(evalset / "m.json")),
    )
    _, samples = load_samples(evalset / "samples.json")
    edited = [s.name for s in samples if s.task == samples[0].task]
    originals = {name: (root / name / "prompt.txt").read_bytes() for name in edited}
    kit = Path(shutil.copytree(evalkit, tmp_path / "evalkit", ignore=shutil.ignore_patterns("__pycache__")))
    entry = kit / "run_evaluation.py"
    entry.write_text(
        entry.read_text().replace(
            "    try:\n",
            "    import os\n\n    if os.environ.get('VG_TEST_EDIT_TASK') == task_name:\n"
            "        with open(os.path.join(gt_info['gt_path'], 'prompt.txt'), 'a') as f:\n"
            "            f.write(' edited')\n    try:\n",
            1,
        )
    )
    sections = {**VIDEO, "evalkit": {**SCORING["evalkit"], "digest": evalkit_source_digest(kit)}, "matrix": MATRIX}
    _videos(tmp_path / "videos", samples)
    out = tmp_path / "cell"
    args = score_args(evalset, tmp_path / "videos", out, kit)
    failed = stage("score-cell", sections, *args, check=False, VG_TEST_EDIT_TASK=samples[0].task)
    assert failed.returncode == 4, failed.stderr[-3000:]
    assert "changed since eval_set recorded it" in failed.stderr and "while this stage ran" in failed.stderr
    kept = sorted(json.loads(p.read_text())["name"] for p in (out / "work").rglob("*.json"))
    assert kept == sorted(s.name for s in samples if s.name not in edited)
    assert not (out / "scores.csv").exists()
    for name, text in originals.items():
        (root / name / "prompt.txt").write_bytes(text)
    stage("score-cell", sections, *args)
    assert sorted(pd.read_csv(out / "scores.csv")["name"]) == sorted(s.name for s in samples)


def test_scoring_plays_the_videos_at_the_evaluation_duration_cap_not_the_training_one(evalset, evalkit, tmp_path):
    """matrix.max_seconds (the release evaluation's 5 s) caps the scorer videos, whatever evalkit.max_seconds
    (the training reward's) says: 17 frames in at most 0.5 s play at ceil(17 / 0.5) = 34 fps, not 16."""
    from videogrpo.config import Config
    from videogrpo.data.video import playback_fps, video_problem

    assert Config().matrix.max_seconds == 5.0 and playback_fps(81, 16, Config().matrix.max_seconds) == 17
    _, samples = load_samples(evalset / "samples.json")
    _videos(tmp_path / "videos", samples)
    out = tmp_path / "cell"
    scoring = {**SCORING["evalkit"], "digest": evalkit_source_digest(evalkit)}  # the scorer re-checks the pin
    sections = {**VIDEO, "evalkit": scoring, "matrix": {**MATRIX, "max_seconds": 0.5}}
    stage("score-cell", sections, *score_args(evalset, tmp_path / "videos", out, evalkit))
    prepared = sorted((out / "prepared").rglob("*.mp4"))
    assert len(prepared) == len(samples)
    assert all(video_problem(p, 17, 128, 128, 34) is None for p in prepared)


def test_aggregates_are_plain_means_and_the_delta_pairs_samples():
    names = [f"d/t{i}/0000{i}" for i in range(4)]
    frame = pd.DataFrame(
        {
            "name": names,
            "domain": ["In-Domain_50", "In-Domain_50", "In-Domain_50", "Out-of-Domain_50"],
            "task": ["a", "a", "b", "c"],
            "score": [0.2, 0.4, 0.6, 1.0],
        }
    )
    table = summarize(frame, 200, 0).set_index("name")
    assert table.loc["a", "mean"] == pytest.approx(0.3) and table.loc["In-Domain_50", "mean"] == pytest.approx(0.4)
    assert table.loc["a", "se"] == pytest.approx(np.std([0.2, 0.4], ddof=1) / np.sqrt(2))
    assert table.loc["overall", "mean"] == pytest.approx(0.55) and table.loc["overall", "samples"] == 4
    low, high = bootstrap_interval(np.array([0.2, 0.4, 0.6, 1.0]), 200, 0)
    assert 0.2 <= low < 0.55 < high <= 1.0
    trained = frame.assign(score=frame.score + np.array([0.1, 0.1, 0.1, -0.3]))
    cells = {("base", "euler"): frame, ("trained", "euler"): trained.iloc[::-1]}  # order must not matter
    matrix = matrix_table(cells, "base", 200, 0).set_index(["model", "domain"])
    assert matrix.loc[("trained", "In-Domain_50"), "delta_vs_base"] == pytest.approx(0.1)
    assert matrix.loc[("trained", "overall"), "delta_vs_base"] == pytest.approx(0.0)
    assert np.isnan(matrix.loc[("base", "overall")].get("delta_vs_base", np.nan))


def test_the_report_shows_a_matrix_whose_interval_is_undefined():
    """One sample in a domain has no interval (empty in the CSV): shown as nan, not a crash."""
    from videogrpo.provenance.report_page import render_html

    provenance = {
        "git": {"commit": None},
        "run_id": "tiny-x",
        "generated_at": "now",
        "timings": {},
        "digests": {},
        "versions": {},
        "config": {},
    }
    row = {"model": "base", "sampler": "euler", "domain": "overall", "samples": "1", "mean": "0.5"}
    page = render_html(provenance, [], [], None, [dict(row, ci_low="", ci_high="")])
    assert "0.500 [nan, nan]" in page and "alt='evaluation matrix'" in page
