"""Every third-party module the shipped code imports is installed by the README's install.

`scripts/install.sh` (which `scripts/demo.sh` runs) installs setup.py's install_requires, the
TensorFlow extra of the machine (`cpu` or `gpu`) and Horovod (the `horovod` extra, built by
the script), and nothing else: the `oracles`, `bench` and `test` extras are for the tests and
benchmarks. A module imported only by the oracles' grace (safetensors was: `bert-convert-checkpoint
hf2tf` ended in `No module named 'safetensors'` on the demo's install while the suite, which
has the oracles, was green) is found here without building an environment.

Read statically (ast) in every module of the shipped packages and the top-level scripts,
imports inside functions included. An import's distribution comes from this environment
(`importlib.metadata.packages_distributions`, which the test's environment, with everything
installed, can answer) or, for a module this CPU machine cannot have installed, from
`NOT_INSTALLED_HERE`. An import inside `try: ... except ImportError` (or a broader except) may
name something outside those requirements when its handler says in one line what to install
(a string with "install" in it) or when `FALLBACKS` says what the code does without it.
What `tests/test_readme_install.py` runs in the demo's real environment covers the imports at
run time.
"""
import ast
import importlib.metadata as metadata
import os
import re
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = ("cli", "pretraining", "finetuning", "training", "runtime", "resilience", "modeling",
           "optimization", "data_prep", "reporting")
# What scripts/install.sh installs besides install_requires (`EXTRAS="$FLAVOR,test"` plus
# the Horovod wheel it builds; `test` is pytest, which no shipped module imports).
INSTALLED_EXTRAS = ("cpu", "gpu", "horovod")
# Modules of packages a CPU machine does not install (the gpu extra's), by the package that
# provides them (its wheel's top-level module).
NOT_INSTALLED_HERE = {"pynvml": "nvidia-ml-py"}
# Guarded imports that need no install line: what the code does without the module.
FALLBACKS = {
    ("runtime/devices.py", "nvidia"): "the CUDA libraries of pip's nvidia-* wheels (the gpu "
                                      "extra's) are looked for elsewhere",
}


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(text):
    """('dask', ('distributed',)) of 'dask[distributed]>=2024.8,<2027'."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", text)
    extras = tuple(e.strip() for e in (match.group(2) or "").split(",") if e.strip())
    return canonical(match.group(1)), extras


def setup_requirements():
    """{extra or '': [requirement strings]} from setup.py's setup() call."""
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as source:
        tree = ast.parse(source.read())
    constants = {node.targets[0].id: node.value.value for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)}

    def strings(node):
        out = []
        for element in node.elts:
            if isinstance(element, ast.Constant):
                out.append(element.value)
            elif isinstance(element, ast.JoinedStr):  # f"tensorflow-cpu=={TF_VERSION}"
                out.append("".join(str(part.value) if isinstance(part, ast.Constant)
                                   else str(constants[part.value.id]) for part in element.values))
        return out

    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "setup")
    keywords = {keyword.arg: keyword.value for keyword in call.keywords}
    found = {"": strings(keywords["install_requires"])}
    extras = keywords["extras_require"]
    for key, value in zip(extras.keys, extras.values):
        found[key.value] = strings(value)
    return found


def installed_by_the_readme():
    """The distributions the README's install brings that shipped code may import: the
    requirements, and those a requirement's named extras bring (dask[distributed] brings
    distributed), read from the installed package's metadata."""
    requirements = setup_requirements()
    names = set()
    for extra in ("",) + INSTALLED_EXTRAS:
        for text in requirements[extra]:
            name, extras = requirement_name(text)
            names.add(name)
            if extras:
                try:
                    requires = metadata.requires(name) or []
                except metadata.PackageNotFoundError:
                    continue
                for line in requires:
                    marker = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", line)
                    if marker and marker.group(1) in extras:
                        names.add(requirement_name(line)[0])
    return names


def shipped_files():
    files = [name for name in os.listdir(REPO) if name.endswith(".py") and name != "setup.py"]
    for package in SHIPPED:
        for folder, _, names in os.walk(os.path.join(REPO, package)):
            files += [os.path.relpath(os.path.join(folder, name), REPO) for name in names
                      if name.endswith(".py")]
    return sorted(files)


def _catches_import_errors(handler):
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(getattr(t, "id", getattr(t, "attr", "")) in
               ("ImportError", "ModuleNotFoundError", "Exception", "BaseException") for t in types)


def third_party_imports(path):
    """[(top-level module, line, guard)] of `path`; guard: None, or the except handlers of
    the try that catches the import's ImportError. Modules run with `python -m` through
    tethered_command (wikiextractor) count as imports."""
    with open(os.path.join(REPO, path), encoding="utf-8") as source:
        tree = ast.parse(source.read())
    local = set(SHIPPED) | {name[:-3] for name in os.listdir(REPO) if name.endswith(".py")}
    found = []

    def visit(node, guard):
        if isinstance(node, ast.Try):
            handlers = [h for h in node.handlers if _catches_import_errors(h)]
            for child in node.body:
                visit(child, handlers or guard)
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, guard)
            return
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module]
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "tethered_command"
              and node.args and isinstance(node.args[0], ast.Constant)):
            names = [node.args[0].value]
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in local and top != "__future__":
                found.append((top, node.lineno, guard))
        for child in ast.iter_child_nodes(node):
            visit(child, guard)

    visit(tree, None)
    return found


def says_what_to_install(handlers):
    """A handler whose text (its strings) names something to install, in one line."""
    for handler in handlers:
        for node in ast.walk(handler):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and "install" in node.value and "\n" not in node.value:
                return True
    return False


def test_every_third_party_import_of_shipped_code_is_installed_by_the_readme():
    allowed = installed_by_the_readme()
    providers = metadata.packages_distributions()
    problems, fallbacks_used = [], set()
    for path in shipped_files():
        for module, line, guard in third_party_imports(path):
            dists = {canonical(d) for d in providers.get(module, [])}
            if module in NOT_INSTALLED_HERE:
                dists.add(canonical(NOT_INSTALLED_HERE[module]))
            if dists & allowed:
                continue
            where = f"{path}:{line} imports {module}"
            if guard is None:
                problems.append(f"{where} ({', '.join(sorted(dists)) or 'not installed here'}), "
                                f"which setup.py's install_requires and extras "
                                f"{INSTALLED_EXTRAS} do not name")
            elif (path, module) in FALLBACKS:
                fallbacks_used.add((path, module))
            elif not says_what_to_install(guard):
                problems.append(f"{where} inside a try whose except says nothing of what to "
                                f"install (and FALLBACKS does not name it)")
    assert not problems, "\n".join(problems)
    assert fallbacks_used == set(FALLBACKS), set(FALLBACKS) - fallbacks_used


def test_the_checks_of_this_module_find_what_they_look_for(tmp_path):
    """The reader itself: an unguarded import, a guarded one with and without an install line,
    an import inside a function, a tethered module, and a requirement's extra."""
    assert requirement_name("dask[distributed]>=2024.8,<2027") == ("dask", ("distributed",))
    assert requirement_name("tensorflow[and-cuda]==2.15.1") == ("tensorflow", ("and-cuda",))
    requirements = setup_requirements()
    assert "tensorflow-cpu==2.15.1" in requirements["cpu"]
    source = ("import numpy\n"
              "def f():\n    from safetensors.numpy import load_file\n"
              "try:\n    import torch\nexcept ImportError:\n"
              "    raise SystemExit('needs torch (pip install torch)')\n"
              "try:\n    import pynvml\nexcept Exception:\n    pynvml = None\n"
              "tethered_command('wikiextractor.WikiExtractor', [])\n")
    module = "cli/_probe_for_test_dependencies.py"
    path = os.path.join(REPO, module)
    with open(path, "w", encoding="utf-8") as out:
        out.write(source)
    try:
        found = third_party_imports(module)
    finally:
        os.remove(path)
    by_name = {name: guard for name, _, guard in found}
    assert sorted(by_name) == ["numpy", "pynvml", "safetensors", "torch", "wikiextractor"]
    assert by_name["numpy"] is None and by_name["safetensors"] is None
    assert says_what_to_install(by_name["torch"])
    assert not says_what_to_install(by_name["pynvml"])
    if "dask" in {canonical(d.metadata["Name"]) for d in metadata.distributions()}:
        assert "distributed" in installed_by_the_readme()
    else:
        pytest.skip("dask not installed here: its extra's distributions cannot be read")
