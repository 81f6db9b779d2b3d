"""The package's layers: a module imports only modules of its own package or of lower layers, never a sibling of its
layer or anything above it. The graph is provenance/code.py's, which the code identity uses too: every `import`,
lazy ones inside functions included (the modules its strings name, which the code identity follows too, are data
here: a list of module names is no import)."""

from __future__ import annotations

from videogrpo.provenance import code

# Top to bottom; the packages of one layer are independent of each other.
LAYERS = (
    ("videogrpo.cli",),
    ("videogrpo.stages",),
    ("videogrpo.pipeline",),
    ("videogrpo.launch", "videogrpo.demo"),
    ("videogrpo.evaluation", "videogrpo.preflight"),
    ("videogrpo.grpo",),
    ("videogrpo.parallel", "videogrpo.rewards"),
    ("videogrpo.models", "videogrpo.data", "videogrpo.artifacts"),
    ("videogrpo.provenance",),
    ("videogrpo.config",),
    ("videogrpo.errors", "videogrpo.atomic", "videogrpo.progress"),
)


def place(module: str) -> tuple[int, str] | None:
    """(layer index, the package of the layer) of a module; None for the package root."""
    for index, packages in enumerate(LAYERS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return index, package
    return None


def violations(graph: dict[str, frozenset[str]]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        here = place(module)
        if here is None:
            continue
        for dep in sorted(imported):
            there = place(dep)
            if there is None or there[1] == here[1]:
                continue
            if there[0] < here[0]:
                found.append(f"{module} imports {dep}, a layer above it")
            elif there[0] == here[0]:
                found.append(f"{module} imports {dep}, a sibling of its layer")
    return found


def test_every_module_of_the_package_has_a_layer():
    assert [m for m in code.import_graph(named=False) if m != "videogrpo" and place(m) is None] == []


def test_no_module_imports_a_layer_above_it_or_a_sibling():
    assert violations(code.import_graph(named=False)) == []


def test_the_check_names_an_upward_import(tmp_path):
    graph = dict(code.import_graph(named=False))
    graph["videogrpo.models.wan"] = graph["videogrpo.models.wan"] | {"videogrpo.grpo.trainer"}
    graph["videogrpo.rewards.rule"] = graph["videogrpo.rewards.rule"] | {"videogrpo.parallel.fsdp"}
    assert violations(graph) == [
        "videogrpo.models.wan imports videogrpo.grpo.trainer, a layer above it",
        "videogrpo.rewards.rule imports videogrpo.parallel.fsdp, a sibling of its layer",
    ]


def test_every_package_opens_with_what_it_holds_and_what_it_may_import():
    import ast

    for init in sorted(code.PACKAGE_DIR.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 80, f"{init}: a paragraph saying what the package holds"
        if init.parent.name != "stages":
            assert "May import" in doc, f"{init}: say what the package may import"


def cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (strongly connected components of
    more than one module), lazy imports included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for dep in graph.get(module, ()):
            if dep not in graph or dep == module:
                continue
            if dep not in index:
                visit(dep)
                low[module] = min(low[module], low[dep])
            elif dep in stack:
                low[module] = min(low[module], index[dep])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_two_modules_import_each_other():
    """A cycle, lazy or not, means two modules are one concern split in two: merge them, or move what both need
    below both (grpo.draws holds the keyed draws that rollout and sde_window both take)."""
    assert cycles(code.import_graph(named=False)) == []


def test_the_cycle_check_finds_a_lazy_pair_and_a_longer_ring():
    graph = dict(code.import_graph(named=False))
    graph["videogrpo.grpo.draws"] = graph["videogrpo.grpo.draws"] | {"videogrpo.grpo.sde_window"}
    graph["videogrpo.models.wan"] = graph["videogrpo.models.wan"] | {"videogrpo.grpo.flops"}
    graph["videogrpo.grpo.flops"] = graph["videogrpo.grpo.flops"] | {"videogrpo.models.shapes"}
    graph["videogrpo.models.shapes"] = graph["videogrpo.models.shapes"] | {"videogrpo.models.wan"}
    assert cycles(graph) == [
        ["videogrpo.grpo.draws", "videogrpo.grpo.sde_window"],
        ["videogrpo.grpo.flops", "videogrpo.models.shapes", "videogrpo.models.wan"],
    ]
