"""oodeval's layers hold (docs/extending.md#layers): the import-linter contracts of pyproject.toml
pass, and fail naming the import when a module imports from a layer above it or another package's
private module; no import cycle joins oodeval's modules; imports of its own modules sit at module level.

Each check runs on a source tree in a subprocess (``PYTHONPATH`` = that tree), so the negative
cases run on a copy of ``src/oodeval`` with a leak added."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

CYCLES = textwrap.dedent("""
    import json, sys
    import grimp
    graph = grimp.build_graph("oodeval", cache_dir=None)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) - {"oodeval"}) for m in sorted(graph.modules)}
    index, low, stack, on, out = {}, {}, [], set(), []
    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index); stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop()); on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10_000)
    for m in edges:
        if m not in index:
            visit(m)
    print(json.dumps(out))
""")


def _run(code_or_cli: list[str], src: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run([sys.executable, *code_or_cli], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def lint(src: Path, config: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with ``config`` on the package under ``src``."""
    cli = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return _run(["-c", cli, "--no-cache", "--no-logo", str(config)], src, config.parent)


def cycles(src: Path) -> list[set[str]]:
    done = _run(["-c", CYCLES], src, src)
    assert done.returncode == 0, done.stderr
    return [set(c) for c in json.loads(done.stdout)]


def inner_imports(package: Path) -> tuple[int, int]:
    """(imports of oodeval's own modules, those inside a function), counted over the AST of every module."""
    total = inner = 0
    for path in package.rglob("*.py"):
        def visit(node: ast.AST, in_function: bool) -> None:
            nonlocal total, inner
            for child in ast.iter_child_nodes(node):
                here = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                own = (isinstance(child, ast.ImportFrom) and (child.level > 0 or (child.module or "").split(".")[0] == "oodeval")) or (
                    isinstance(child, ast.Import) and any(a.name.split(".")[0] == "oodeval" for a in child.names))
                if own:
                    total += 1
                    inner += here
                visit(child, here)
        visit(ast.parse(path.read_text()), False)
    return total, inner


#: heavy optional dependencies: imported at module level by the modules that need them on every
#: path, or through oodeval._extras.optional, never by an import statement inside a function
HEAVY = ("torch", "torchvision", "timm", "open_clip", "transformers", "submitit", "ray")


def heavy_imports_in_functions(package: Path) -> list[str]:
    """``path:line module`` of every import statement of a :data:`HEAVY` package inside a function."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                found += [f"{path.relative_to(package)}:{node.lineno} {n}" for n in names if n.split(".")[0] in HEAVY]
    return found


@pytest.fixture(scope="module")
def leaky(tmp_path_factory) -> Path:
    """A copy of the tree in which metrics (a bottom layer) imports the experiment layer inside a
    function, the zero-shot scorers import detectors._common, and stats and metrics import each other."""
    root = tmp_path_factory.mktemp("leaky")
    shutil.copytree(SRC / "oodeval", root / "src" / "oodeval", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    pkg = root / "src" / "oodeval"
    with open(pkg / "metrics.py", "a") as fh:
        fh.write("\n\ndef _leak():\n    from .experiment.config import load_config\n\n    from .stats import bootstrap\n\n    return load_config, bootstrap\n")
        fh.write("\n\ndef _heavy():\n    import torch\n\n    return torch\n")
    with open(pkg / "zeroshot" / "scorers.py", "a") as fh:
        fh.write("\n\nfrom ..detectors._common import as64  # noqa: E402\n")
    return root


def test_the_import_contracts_hold_on_the_tree():
    done = lint(SRC, ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout


def test_an_upward_or_private_import_breaks_the_contracts(leaky):
    done = lint(leaky / "src", leaky / "pyproject.toml")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 0 kept, 2 broken." in done.stdout
    assert "oodeval.metrics is not allowed to import oodeval.experiment" in done.stdout
    assert "oodeval.metrics -> oodeval.experiment.config" in done.stdout
    assert "oodeval.zeroshot.scorers -> oodeval.detectors._common" in done.stdout


def test_no_import_cycle_joins_oodeval_modules(leaky):
    found = cycles(SRC)
    assert found == [], found
    assert any({"oodeval.metrics", "oodeval.stats"} <= c for c in cycles(leaky / "src"))  # a cycle closed inside a function counts


def test_imports_of_oodeval_modules_sit_at_module_level(leaky):
    total, inner = inner_imports(SRC / "oodeval")
    assert total > 300 and inner / total < 0.10, (inner, total)
    total_leaky, inner_leaky = inner_imports(leaky / "src" / "oodeval")
    assert (total_leaky, inner_leaky) == (total + 3, inner + 2)  # the counter sees the copy's added imports


def test_starting_one_command_imports_no_other():
    """With imports at module level, a command module imports what it runs; ``oodeval --help``
    imports no command and ``oodeval CMD`` only CMD's, so neither pays for every command's imports."""
    code = textwrap.dedent("""
        import contextlib, io, json, sys
        from oodeval.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                main(sys.argv[1:])
            except SystemExit:
                pass
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("oodeval.commands.") and "._" not in m)))
    """)
    for argv, loaded in (([], []), (["--help"], []), (["-v", "metrics", "--help"], ["oodeval.commands.metrics"])):
        done = _run(["-c", code, *argv], SRC, ROOT)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1]) == loaded, argv


def test_heavy_dependencies_load_at_module_level_or_through_one_lazy_loader(leaky):
    assert heavy_imports_in_functions(SRC / "oodeval") == []
    assert heavy_imports_in_functions(leaky / "src" / "oodeval") == [f"metrics.py:{len((leaky / 'src' / 'oodeval' / 'metrics.py').read_text().splitlines()) - 2} torch"]
