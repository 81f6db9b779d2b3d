"""The documentation: every relative link and anchor resolves, no page cites a document the project does not
ship, and the check that every documented command was run by a test (tests/doc_commands.py) finds what it must."""

from __future__ import annotations

import re
from pathlib import Path

import doc_commands
import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "config/README.md",
    REPO / "bench/RESULTS.md",
    REPO / "tools/ref_diff/README.md",
]
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"^#{1,6} (.+)$", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    out, in_code = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            out += [(number, target) for target in LINK.findall(line)]
    return out


def broken_links(pages: list[Path]) -> list[str]:
    problems = []
    for page in pages:
        for number, target in links(page):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def test_every_relative_link_and_anchor_of_the_docs_resolves():
    assert broken_links(PAGES) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    (tmp_path / "b.md").write_text("# Title\n\n## The `x` part: one, two\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#the-x-part-one-two) [gone](c.md) [bad](b.md#nope) [self](#title-here)\n# Title here\n")
    assert broken_links([page]) == [
        "a.md:1: c.md: no such file",
        "a.md:1: b.md#nope: no heading with anchor #nope in b.md",
    ]


def test_no_page_or_module_cites_a_document_the_project_does_not_ship():
    cited = []
    for root in ("src", "tests", "docs", "tools", "bench", "config", "workflow"):
        for path in (REPO / root).rglob("*"):
            if (
                path.is_file()
                and path.suffix in (".py", ".md", ".yaml", ".smk", ".json", ".sh")
                and path != Path(__file__)
            ):
                cited += [
                    f"{path.relative_to(REPO)}" for line in path.read_text().splitlines() if "REFERENCE section" in line
                ]
    cited += ["README.md"] if "REFERENCE section" in (REPO / "README.md").read_text() else []
    assert cited == []


@pytest.fixture
def docs(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "config/README.md").write_text("")
    (tmp_path / "README.md").write_text(
        "```bash\nsnakemake --cores 2   # all of it\nsnakemake --profile p --configfile r.yaml\n```\n"
        "```sh\n# a comment line\nMASTER_ADDR=<machine 0's address> WORLD_SIZE=2 RANK=1 snakemake --cores all\n"
        "videogrpo verify results/runs/$(videogrpo config --run-id)\n```\n"
        "```yaml\nnot: a command\n```\n"
    )
    return tmp_path


def entry(command, env=None, returncode=0):
    return {"command": command, "env": env or {}, "returncode": returncode, "test": "t"}


def test_the_documented_commands_are_the_shell_blocks_lines_without_comments(docs):
    assert [c for _, _, c in doc_commands.documented(docs)] == [
        "snakemake --cores 2",
        "snakemake --profile p --configfile r.yaml",
        "MASTER_ADDR=<machine 0's address> WORLD_SIZE=2 RANK=1 snakemake --cores all",
        "videogrpo verify results/runs/$(videogrpo config --run-id)",
    ]


def test_a_command_counts_as_run_exactly_as_a_dry_run_or_with_a_placeholder_filled(docs):
    ran = [
        entry(["/venv/bin/snakemake", "--cores", "2"]),
        entry(["snakemake", "-n", "--profile", "p", "--configfile", "r.yaml"]),  # its dry run
        entry(["snakemake", "--cores", "all"], env={"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1"}),
        entry(["bash", "-c", "videogrpo verify results/runs/$(videogrpo config --run-id)"][2]),
    ]
    assert doc_commands.unrun(ran, docs) == []


def test_each_line_of_a_script_a_test_ran_counts_as_run(docs):
    """A block whose first lines set shell variables for the last runs as one script, placeholders filled and `-p`
    added; a line the script left out is still reported."""
    (docs / "docs/k8s.md").write_text(
        "```sh\nBUCKET=\"s3://<your bucket>/runs\"\nprintf 'x: 1\\n' > k.yaml\n"
        'snakemake -n --default-storage-prefix "$BUCKET" k.yaml\n```\n'
    )
    script = 'BUCKET="s3://videogrpo/runs"\nsnakemake -n -p --default-storage-prefix "$BUCKET" k.yaml'
    unrun = [where for where in doc_commands.unrun([entry(script)], docs) if where[0] == "docs/k8s.md"]
    assert unrun == [("docs/k8s.md", 3, "printf 'x: 1\\n' > k.yaml")]


def test_a_command_no_test_ran_is_reported_with_its_file_and_line(docs):
    ran = [
        entry(["snakemake", "--cores", "1"]),  # other arguments: not the documented command
        entry(["snakemake", "--profile", "p"]),
        entry(["snakemake", "--cores", "all"], env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "h"}),
    ]
    assert doc_commands.unrun(ran, docs) == [
        ("README.md", 2, "snakemake --cores 2"),
        ("README.md", 3, "snakemake --profile p --configfile r.yaml"),
        ("README.md", 7, "MASTER_ADDR=<machine 0's address> WORLD_SIZE=2 RANK=1 snakemake --cores all"),
        ("README.md", 8, "videogrpo verify results/runs/$(videogrpo config --run-id)"),
    ]


def test_every_command_the_check_leaves_out_is_still_documented():
    shown = {command for _, _, command in doc_commands.documented()}
    assert [c for c in doc_commands.NOT_RUN_HERE if c not in shown] == []


def test_every_videogrpo_command_a_page_names_exists():
    """`videogrpo <command>` and `videogrpo stage <stage>` in prose and code of every page are commands the CLI has
    (a renamed command leaves no stale name behind, bench/RESULTS.md's included)."""
    from videogrpo.cli import build_parser
    from videogrpo.stages import STAGES

    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    stages = {name.replace("_", "-") for name in STAGES} | {"k8s-job"}
    problems = []
    for page in PAGES:
        in_code = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_code = not in_code
                continue
            for code in [line] if in_code else re.findall(r"`([^`]+)`", line):  # commands, not prose
                for command, stage in re.findall(
                    r"\bvideogrpo (?:stage )?([a-z][a-z0-9-]+)(?: ([a-z][a-z0-9-]+))?", code
                ):
                    if command == "stage" and stage and stage not in stages:
                        problems.append(f"{page.relative_to(REPO)}:{number}: videogrpo stage {stage}")
                    elif command != "stage" and command not in commands and f"videogrpo stage {command}" not in code:
                        problems.append(f"{page.relative_to(REPO)}:{number}: videogrpo {command}")
    assert not problems, "\n".join(problems)
