"""The run as a Workflow Run RO-Crate: ro-crate-metadata.json at the run directory's root.

One CreateAction per stage (start, end, host, SLURM job, the inputs it read and the outputs it made), the
workflow as its instrument, and every artifact with its SHA-256 and size. Artifacts inside the run
directory are data entities (File or Dataset, by relative path); the shared downloads, dataset and
EvalKit records outside it are contextual entities that name their path. Only the metadata is
written: nothing is copied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROFILES = ("https://w3id.org/ro/wfrun/process/0.5", "https://w3id.org/ro/wfrun/workflow/0.5")


def write_run_crate(run_dir: Path, provenance: dict[str, Any]) -> Path:
    from rocrate.model.contextentity import ContextEntity
    from rocrate.rocrate import ROCrate

    root = run_dir.resolve()
    crate = ROCrate(gen_preview=False)
    crate.name = f"videogrpo run {provenance['run_id']}"
    crate.root_dataset["conformsTo"] = [crate.add(ContextEntity(crate, p, {"@type": "CreativeWork"})) for p in PROFILES]
    git = provenance.get("git") or {}
    workflow = crate.add(
        ContextEntity(
            crate,
            "#workflow",
            {
                "@type": ["SoftwareSourceCode", "ComputationalWorkflow"],
                "name": "videogrpo Snakemake workflow",
                "version": str(git.get("commit")),
                "programmingLanguage": "Snakemake",
            },
        )
    )
    crate.mainEntity = workflow
    entities: dict[str, Any] = {}

    def entity(record: dict[str, Any]) -> Any:
        path = Path(record["path"]).resolve()
        if str(path) in entities:
            return entities[str(path)]
        properties = {"sha256": record.get("sha256") or record.get("tree_sha256"), "contentSize": record.get("size")}
        if path.is_relative_to(root):
            rel = path.relative_to(root).as_posix()
            if record["kind"] == "directory":
                found = crate.add_dataset(str(path), dest_path=rel + "/", properties=properties)
            else:
                found = crate.add_file(str(path), dest_path=rel, properties=properties)
        else:
            kind = "Dataset" if record["kind"] == "directory" else "File"
            found = crate.add(
                ContextEntity(
                    crate, f"#{properties['sha256']}", dict(properties, **{"@type": kind, "name": record["path"]})
                )
            )
        entities[str(path)] = found
        return found

    actions = []
    for name, manifest in provenance["stages"].items():
        action = crate.add(
            ContextEntity(
                crate,
                f"#stage-{name}",
                {
                    "@type": "CreateAction",
                    "name": name,
                    "startTime": manifest["started_at"],
                    "endTime": manifest["ended_at"],
                    "host": manifest["host"],
                    "slurmJobId": manifest["slurm_job_id"],
                },
            )
        )
        action["instrument"] = workflow
        action["object"] = [entity(record) for record in manifest["inputs"].values()]
        action["result"] = [entity(record) for record in manifest["outputs"].values()]
        actions.append(action)
    crate.root_dataset["mentions"] = actions
    crate.metadata.write(str(root))
    return root / "ro-crate-metadata.json"
