"""The Snakemake workflow catalog's conventions: its usage file, and config/README.md generated from the
config dataclasses."""

import re

import yaml

from videogrpo import config
from videogrpo.config.docs import markdown_reference


def test_config_readme_is_generated_from_the_dataclasses(repo):
    on_disk = (repo / "config/README.md").read_text()
    assert on_disk == markdown_reference(config.json_schema()), "run: videogrpo schema --markdown > config/README.md"
    for path in config.field_paths():
        assert f"| `{path}` |" in on_disk, path


def test_config_readme_names_every_config_file(repo):
    text = (repo / "config/README.md").read_text()
    files = [p for p in (repo / "config").iterdir() if p.is_file() and p.name != "README.md"]
    files += list((repo / "config/recipes").glob("*.yaml"))
    assert files
    for path in files:
        assert f"`{path.name}`" in text or f"`recipes/{path.name}`" in text, path
    for folder in ("tasks", "matrix"):
        assert f"`{folder}/*." in text


def test_the_catalog_usage_file_says_what_the_workflow_does(repo):
    usage = yaml.safe_load((repo / ".snakemake-workflow-catalog.yml").read_text())["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert (
        set(usage["mandatory-flags"]) == {"desc", "flags"}
        and "--profile profiles/slurm" in usage["mandatory-flags"]["desc"]
    )
    rules = "".join(p.read_text() for p in [repo / "Snakefile", *(repo / "workflow/rules").glob("*.smk")])
    # No rule declares a conda environment or a container (one pinned venv runs them all): the flags say so.
    uses = {"conda": r"^\s+conda:", "apptainer": r"^\s+container:"}
    for method, pattern in uses.items():
        assert usage["software-stack-deployment"][method] is bool(re.search(pattern, rules, re.M)), method
    assert usage["software-stack-deployment"]["apptainer+conda"] is False
    assert usage["report"] is bool(re.search(r"=report\(", rules.replace(" ", "")))
