"""The layout's rules, read from the code's own imports (docs/architecture.md draws them):
every import points down a floor, no two modules import each other (directly or round a
circle), the top-level scripts only start a command, and no module grows past ~500 lines
without saying why.

Imports inside functions count as much as those at the top: a lazy import is still a
dependency. `tests/` and `bench/` stand above everything and may import anything."""
import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A package imports only packages on lower floors; packages on one floor import not each other.
FLOORS = {
    "cli": 4,            # the commands: flags, --help, main; the demo
    "pretraining": 3,    # the jobs
    "finetuning": 3,
    "training": 2,       # building and running the training step
    "runtime": 1,        # where the process runs: Horovod, devices, threads, XLA, oneDNN
    "resilience": 1,     # keeping a run safe: locks, resumable data order, disk, bad records
    "modeling": 0,       # libraries
    "optimization": 0,
    "data_prep": 0,
    "reporting": -1,     # the ground floor: console, log file, progress, UsageError
}
# Inside a package split into sub-packages, the same rule between its parts.
SUB_FLOORS = {
    "data_prep.bertprep": 3,     # bertPrep.py's actions
    "data_prep.instances": 2,    # create_pretraining_data.py's steps
    "data_prep.wordpiece": 1,    # the tokenizer and vocabulary training
    "data_prep.processes": 1,    # worker processes, temporary files
    "data_prep": 0,              # errors, below all four
}
TOP_LEVEL_SCRIPTS = ("run_pretraining.py", "run_squad.py", "run_classifier.py", "bertPrep.py",
                     "create_pretraining_data.py", "inference.py", "extract_features.py",
                     "demo.py")
MAX_LINES = 500
SIZE_REASON = "Longer than 500 lines because"


def _project_packages():
    return sorted(name for name in os.listdir(REPO)
                  if os.path.isfile(os.path.join(REPO, name, "__init__.py"))
                  and name not in ("tests", "bench"))


def _modules():
    """{dotted name: path} of every module in the project's packages."""
    modules = {}
    for package in _project_packages():
        for root, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                    modules[dotted.removesuffix(".__init__")] = path
    return modules


def _imports(path, dotted, modules):
    """The project modules `path` imports (at any depth of its code)."""
    package = dotted if path.endswith("__init__.py") else dotted.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != dotted:
                found.add(name)
    return found


@pytest.fixture(scope="module")
def graph():
    modules = _modules()
    return {dotted: _imports(path, dotted, modules) for dotted, path in modules.items()}


def test_every_package_has_a_floor():
    assert set(_project_packages()) == set(FLOORS), (
        "a package without a floor (or a floor without a package): place it in FLOORS "
        "and in docs/architecture.md")


def _part(module):
    """The sub-package of SUB_FLOORS `module` belongs to (its longest prefix), or None."""
    prefixes = [part for part in SUB_FLOORS if module == part or module.startswith(part + ".")]
    return max(prefixes, key=len) if prefixes else None


def _runs_up(importer, target):
    top, target_top = importer.split(".")[0], target.split(".")[0]
    if top != target_top:
        return FLOORS[top] <= FLOORS[target_top]
    part, target_part = _part(importer), _part(target)
    return (part is not None and target_part is not None and part != target_part
            and SUB_FLOORS[part] <= SUB_FLOORS[target_part])


def test_every_import_points_down(graph):
    upward = [f"{importer} -> {target}" for importer, imported in graph.items()
              for target in imported if _runs_up(importer, target)]
    assert not upward, "imports that run up or sideways:\n" + "\n".join(sorted(upward))


def test_the_floor_check_sees_an_import_that_runs_up():
    assert _runs_up("data_prep.instances.corpus", "cli.command")
    assert _runs_up("runtime.towers", "resilience.run_lock")          # same floor
    assert _runs_up("data_prep.wordpiece.vocab", "data_prep.instances.corpus")
    assert not _runs_up("data_prep.instances.corpus", "data_prep.errors")
    assert not _runs_up("pretraining.runner", "reporting.console")


def test_every_sub_package_has_a_floor():
    parts = {module for module in _modules() if os.path.isfile(os.path.join(
        REPO, *module.split("."), "__init__.py")) and "." in module}
    split = {module.split(".")[0] for module in SUB_FLOORS}
    assert {part for part in parts if part.split(".")[0] in split} <= set(SUB_FLOORS)


def _circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_modules_import_each_other(graph):
    # A package's __init__ importing its own modules (to export names) is not a circle of
    # two concerns; the module importing its package back would be.
    without_exports = {module: {target for target in imported
                                if not (module == target.rpartition(".")[0])}
                       for module, imported in graph.items()}
    assert _circles(without_exports) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "b": {"a.x"}}) == [
        ["a.x", "a.y", "a.z"]]


@pytest.mark.parametrize("script", TOP_LEVEL_SCRIPTS)
def test_top_level_scripts_only_start_a_command(script):
    path = os.path.join(REPO, script)
    tree = ast.parse(open(path, encoding="utf-8").read())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names]
    assert imported and all(name.split(".")[0] == "cli" for name in imported), imported
    assert sum(1 for _ in open(path, encoding="utf-8")) <= 15


def test_no_module_is_long_without_a_reason():
    long_and_silent = []
    for dotted, path in _modules().items():
        text = open(path, encoding="utf-8").read()
        if text.count("\n") > MAX_LINES and SIZE_REASON not in (ast.get_docstring(
                ast.parse(text)) or ""):
            long_and_silent.append(f"{dotted} ({text.count(chr(10))} lines)")
    assert not long_and_silent, (f"over {MAX_LINES} lines with no '{SIZE_REASON} ...' in the "
                                 "docstring: " + ", ".join(long_and_silent))


def test_every_package_is_installed_and_in_the_image():
    """setup.py's `packages` and the Dockerfile's COPY lines name every package (the image
    once lacked three of them, and `pip install -e .` inside it could not start a command)."""
    setup = ast.parse(open(os.path.join(REPO, "setup.py"), encoding="utf-8").read())
    listed = next(ast.literal_eval(keyword.value) for node in ast.walk(setup)
                  if isinstance(node, ast.Call) for keyword in node.keywords
                  if keyword.arg == "packages")
    packages = sorted(module for module in _modules()
                      if os.path.isfile(os.path.join(REPO, *module.split("."), "__init__.py")))
    assert sorted(listed) == packages
    copied = {line.split()[1] for line in open(os.path.join(REPO, "Dockerfile"),
                                               encoding="utf-8")
              if line.startswith("COPY ") and len(line.split()) == 3}
    assert set(_project_packages()) <= copied, set(_project_packages()) - copied
