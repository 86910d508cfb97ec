import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = "linrnn/cli/"
ENTRY_SCRIPTS = {"linrnn/__main__.py"}  # `python -m linrnn` runs the CLI


def test_import_is_light():
    """`import linrnn` works without a GPU and imports no Triton code."""
    code = (
        "import sys, linrnn; linrnn.build_model('gdn');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton' or m.startswith('linrnn.kernels.triton')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def import_graph(root: Path, package: str = "linrnn") -> dict[str, set[str]]:
    """File → the files of ``package`` it imports, anywhere in it (inside functions too), as paths relative to
    ``root``. ``import a.b`` and ``from a import b`` point at module ``a.b`` where that is a file (a package:
    its ``__init__.py``), else ``from a import b`` at ``a``; relative imports are resolved."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path.relative_to(root).as_posix()
    graph = {}
    for name, file in files.items():
        here = name if file.endswith("__init__.py") else name.rpartition(".")[0]  # the package of relative imports
        targets = set()
        for node in ast.walk(ast.parse((root / file).read_text(), file)):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{anchor}.{base}" if base else anchor
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
        graph[file] = {files[target] for target in targets if target in files} - {file}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as ``[a, b, ..., a]``, or None (depth-first search)."""
    done, path = set(), []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            if cycle := visit(target):
                return cycle
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if cycle := visit(node):
            return cycle
    return None


def test_the_import_checker(tmp_path):
    """Function-level, relative and ``from package import submodule`` imports are arrows; the cycle is named."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "sub" / "b.py").write_text("from ..a import f\nimport os\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg/__init__.py": set(), "pkg/a.py": {"pkg/sub/b.py"}, "pkg/sub/__init__.py": {"pkg/sub/b.py"},
                     "pkg/sub/b.py": {"pkg/a.py"}}  # fmt: skip
    assert find_cycle(graph) == ["pkg/a.py", "pkg/sub/b.py", "pkg/a.py"]


def test_no_library_module_imports_the_cli():
    """The command line (linrnn/cli/) calls the library, never the other way round, not even inside a function."""
    graph = import_graph(REPO)
    assert "linrnn/cli/__init__.py" in graph["linrnn/__main__.py"]
    arrows = [f"{file} → {target}" for file, targets in graph.items() for target in sorted(targets)
              if target.startswith(CLI) and not file.startswith(CLI) and file not in ENTRY_SCRIPTS]  # fmt: skip
    assert not arrows, "library modules import the CLI: " + "; ".join(arrows)


def test_no_import_cycle():
    cycle = find_cycle(import_graph(REPO))
    assert cycle is None, "import cycle: " + " → ".join(cycle)
