"""Every shell command the README and docs show is run by a test: the ledger and its check.

The tests' command runners (`demo.run` and the others that start a documented command) append each command
they ran, with its exit status and the test that ran it, to the ledger file `$VIDEOGRPO_DOC_LEDGER` names.
`make test` sets it for both of its pytest runs and then runs this module as a script, which lists every
command of a ```bash or ```sh block in README.md, docs/*.md and config/README.md and fails on each one that
no test ran. A command counts as run when a test ran

- exactly it (`shlex.split` equal, or by `bash -c` with the same text, alone or as one line of a script: the
  lines of a block that set shell variables for the next ones run so, in one shell);
- its dry run: the same with `-n` added (`snakemake -n`, `make -n`), for what cannot run here in full, and
  `-p` (which prints each job's command) if the test needs to see them;
- it with a test's values where the docs write a placeholder `<...>` (`MASTER_ADDR=<machine 0's address>`).

A few commands need what this machine never has (GPU nodes, a real Kubernetes cluster, PyTorch's own
package index): NOT_RUN_HERE lists them with the reason, and the check prints that list every time.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEDGER_VARIABLE = "VIDEOGRPO_DOC_LEDGER"

# Documented commands no test can run on a CPU machine without a cluster or the wider internet, and why.
NOT_RUN_HERE = {
    (
        """CFG='{"parallel": {"nodes": 16, "procs_per_node": 8, "device": "cuda", "backend": "nccl", """
        """"attention_backend": "_flash_3_hub"}}'"""
    ): "the settings of the two GPU commands that follow it",
    "salloc --nodes=16 --ntasks-per-node=1 --gres=gpu:8": "16 GPU nodes",
    'videogrpo stage train --preflight-only --config-json "$CFG"': "inside a GPU allocation (its logic: "
    "tests/test_node_preflight.py runs the same command in a CPU allocation of the local cluster)",
    'srun --ntasks-per-node=1 --gres=gpu:8 videogrpo stage train --preflight-only --config-json "$CFG"': "GPU nodes",
    "cd /shared/videogrpo": "a real Kubernetes volume",
    "python3 -m venv .venv-gpu": "part of the GPU environment's manual build (PyTorch's own index is out of reach)",
    ".venv-gpu/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128": "PyTorch's index",
    "grep -oE '^[A-Za-z0-9._-]+==[^ ]+' envs/gpu.lock.txt | grep -vE '^(torch|triton|nvidia-|cuda-)' > gpu-pins.txt": (
        "part of the GPU environment's manual build"
    ),
    ".venv-gpu/bin/pip install -r envs/gpu.txt -c gpu-pins.txt": "part of the GPU environment's manual build",
    ".venv-gpu/bin/pip install --no-deps -e .": "part of the GPU environment's manual build",
    ".venv-gpu/bin/pip freeze > gpu-env.freeze.txt": "part of the GPU environment's manual build",
    "bash bench/gpu_smoke.sh": "a GPU node (its CPU form, --cpu, runs in tests/test_gpu_smoke.py)",
    "bash bench/gpu_smoke.sh --no-5b": "a GPU node",
    "bash bench/gpu_wheels.sh": "downloads CUDA wheels from the package index",
}


def doc_files(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md")), repo / "config" / "README.md"]


def documented(repo: Path = REPO) -> list[tuple[str, int, str]]:
    """(file, line, command) of every command line of a ```bash or ```sh block; a trailing `  # comment` and
    comment lines are not part of it."""
    found = []
    for path in doc_files(repo):
        fence = None
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                fence = None if fence is not None else stripped[3:].strip()
                continue
            if fence not in ("bash", "sh") or not stripped or stripped.startswith("#"):
                continue
            command = re.split(r"\s{2,}#", stripped)[0].strip()
            found.append((str(path.relative_to(repo)), number, command))
    return found


def record(argv: list[str] | str, returncode: int, env: dict[str, str] | None = None) -> None:
    """Note in the ledger that a test ran this command (argv, or a `bash -c` string) with these variables set
    by the test on top of its environment."""
    ledger = os.environ.get(LEDGER_VARIABLE)
    if not ledger:
        return
    if isinstance(argv, list) and argv[:1] == ["bash"] and "-c" in argv and argv.index("-c") == len(argv) - 2:
        argv = argv[-1]  # bash [-o pipefail] -c TEXT: the text is the command
    line = json.dumps(
        {
            "command": argv,
            "env": {k: v for k, v in (env or {}).items() if k.isupper()},
            "returncode": returncode,
            "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
        }
    )
    with open(ledger, "a", encoding="utf-8") as f:  # one short line per write: appends never interleave
        f.write(line + "\n")


def _forms(entry: dict) -> list[str]:
    """The ways a ledger entry may be written in the docs."""
    command = entry["command"]
    prefixes = [""] + (
        [" ".join(f"{k}={v}" for k, v in sorted(entry["env"].items())) + " "] if entry.get("env") else []
    )
    if isinstance(command, str):  # by bash -c: as typed, each line of a script, and without a test's -n and -p
        lines = {command.strip(), *(line.strip() for line in command.splitlines() if line.strip())}
        drops = ({"-n"}, {"-p"}, {"-n", "-p"})
        texts = lines | {" ".join(w for w in line.split(" ") if w not in drop) for line in lines for drop in drops}
        return [prefix + text for text in texts for prefix in prefixes]
    argv = list(command)
    if argv and Path(argv[0]).name in ("snakemake", "videogrpo", "make", "python", "bash") and "/" in argv[0]:
        argv[0] = Path(argv[0]).name  # the venv's own binary, as the docs' PATH finds it
    if argv[:1] == ["make"]:  # the tests' venv, handed to make: not part of the documented command
        argv = [a for i, a in enumerate(argv) if not a.startswith("VENV=") and "-o" not in argv[i - 1 : i + 1]]
    # A dry run of the command (-n), and -p, which only prints each job's shell command, are the test's additions.
    variants = [argv, *([a for a in argv if a not in drop] for drop in ({"-n"}, {"-p"}, {"-n", "-p"}))]
    return [prefix + shlex.join(variant) for variant in variants for prefix in prefixes]


def _patterns(command: str) -> list[re.Pattern]:
    """A documented command as patterns over what ran (shlex-normalised, and as typed for `bash -c`), with its
    leading VAR=value words in any order: `<...>` placeholders match anything."""
    texts = {command.strip()}
    try:
        texts.add(shlex.join(shlex.split(command)))
    except ValueError:  # a placeholder's apostrophe: compare as typed
        pass
    patterns = []
    for text in texts:
        marked = re.sub(r"<[^<>]+>", "\0", text)  # one word per placeholder, whatever it says
        for variant in {marked, _env_order_free(marked)}:
            body = ".+".join(re.escape(part) for part in variant.split("\0"))
            patterns.append(re.compile(body + r"\Z", re.S))
    return patterns


def _env_order_free(form: str) -> str:
    """A command with its leading VAR=value words sorted, so that documented and run orders compare."""
    words = form.split(" ")
    count = 0
    while count < len(words) and re.match(r"^[A-Z_][A-Z0-9_]*=", words[count]):
        count += 1
    return " ".join(sorted(words[:count]) + words[count:])


def unrun(entries: list[dict], repo: Path = REPO) -> list[tuple[str, int, str]]:
    """The documented commands (but NOT_RUN_HERE) that no ledger entry ran."""
    forms = {variant for entry in entries for form in _forms(entry) for variant in (form, _env_order_free(form))}
    return [
        (where, number, command)
        for where, number, command in documented(repo)
        if command not in NOT_RUN_HERE and not any(p.match(f) for p in _patterns(command) for f in forms)
    ]


def check(ledger: Path, repo: Path = REPO) -> int:
    entries = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()] if ledger.exists() else []
    commands = documented(repo)
    missing = unrun(entries, repo)
    skipped = sum(1 for _, _, command in commands if command in NOT_RUN_HERE)
    print(f"documented shell commands: {len(commands)}; run by a test: {len(commands) - len(missing) - skipped}")
    print(f"not run here ({len(NOT_RUN_HERE)}), each for want of:")
    for command, why in NOT_RUN_HERE.items():
        print(f"  - {command}   ({why})")
    for where, number, command in missing:
        print(f"{where}:{number}: no test ran: {command}", file=sys.stderr)
    stale = [c for c in NOT_RUN_HERE if c not in {command for _, _, command in commands}]
    for command in stale:
        print(f"NOT_RUN_HERE names a command no doc shows any more: {command}", file=sys.stderr)
    return 1 if missing or stale else 0


if __name__ == "__main__":
    sys.exit(check(Path(sys.argv[1])))
