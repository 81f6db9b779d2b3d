"""The house style, enforced: ruff (lint and format), snakefmt, and Snakemake's own linter."""

import subprocess
import sys
from pathlib import Path

from conftest import REPO

BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True)


def test_ruff_check_and_format():
    for argv in ([str(BIN / "ruff"), "check", "."], [str(BIN / "ruff"), "format", "--check", "."]):
        out = run(*argv)
        assert out.returncode == 0, out.stdout + out.stderr


def test_snakefmt():
    out = run(str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/")
    assert out.returncode == 0, out.stdout + out.stderr


def test_snakemake_lint_is_clean_but_for_the_environment_directive():
    """Every rule runs in the environment of envs/ (README); conda and containers cannot be built here."""
    out = run(str(BIN / "snakemake"), "--lint")
    lints = [line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip().startswith("* ")]
    assert lints and all(line.startswith("* Specify a conda environment or container") for line in lints), lints


def test_what_the_readme_commands_write_in_the_checkout_is_ignored():
    """`snakemake --report report.html` and `make dag` write into the checkout: git status must stay clean."""
    written = ["report.html", "dag.svg", "rulegraph.svg"]
    out = run("git", "check-ignore", "--no-index", *written)
    assert sorted(out.stdout.split()) == sorted(written), out.stdout + out.stderr
