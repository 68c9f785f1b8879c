"""The package's layout holds: the model library imports nothing from train.py's harness (nor what only the harness
needs), no function runs past a screen, settings are read by attribute, and the README's family table is the
registry's."""

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import vit_rope
from vit_rope import FAMILIES, SCALING_MODES

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted(m.name for m in pkgutil.walk_packages(vit_rope.__path__, "vit_rope.") if ".training" not in m.name)
HARNESS_ONLY = ("vit_rope.training", "tqdm", "matplotlib")  # the harness, and what `pip install vit-rope[train]` adds


def test_every_library_module_imports_with_the_harness_blocked():
    """Each library module imports in a fresh interpreter where importing the harness (or tqdm, matplotlib) fails:
    `pip install vit-rope` alone serves the models."""
    assert {"vit_rope.vit", "vit_rope.tables", "vit_rope.families.axial"} <= set(LIBRARY)
    block = "; ".join(f"sys.modules[{name!r}] = None" for name in HARNESS_ONLY)
    code = f"import importlib, sys; {block}; [importlib.import_module(m) for m in {LIBRARY!r}]"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    harness = subprocess.run([sys.executable, "-c", f"import sys; {block}; import vit_rope.training.settings"],
                             capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert harness.returncode != 0  # (the block has teeth)


def package_imports() -> dict[str, set[str]]:
    """Module → the package's modules it imports (anywhere in it: at the top or inside a function)."""
    modules = {}
    for path in (ROOT / "vit_rope").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_circle_of_imports_in_the_package():
    """No module imports one that imports it back, directly or round a circle (a lazy import inside a function
    counts too: it is a circle all the same, only hidden)."""
    graph = package_imports()
    assert {"vit_rope.vit", "vit_rope.training.data"} <= graph.keys() and graph["vit_rope.vit"]
    circles = []

    def walk(start: str, path: list[str]) -> None:
        for nxt in sorted(graph[path[-1]]):
            if nxt == start:
                circles.append(" -> ".join([*path, start]))
            elif nxt > start and nxt not in path:  # each circle once, from its smallest module
                walk(start, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    assert not circles, f"circles of imports: {circles[:5]}"


def functions(path: Path):
    """(class or '', function node) of every function in a file."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for child in ast.walk(node):
                if isinstance(child, ast.FunctionDef):
                    yield node.name, child
        elif isinstance(node, ast.Module):
            for child in node.body:
                if isinstance(child, ast.FunctionDef):
                    yield "", child


SOURCES = [*sorted((ROOT / "vit_rope").rglob("*.py")), ROOT / "train.py", *sorted((ROOT / "bench").glob("*.py"))]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_runs_past_a_screen(path):
    """50 lines at most; a model's constructor may run longer, as timm's do (its arguments one a line)."""
    long = [
        f"{cls}.{f.name}" if cls else f.name
        for cls, f in functions(path)
        if f.end_lineno - f.lineno + 1 > 50 and not (f.name == "__init__" and cls.endswith("VisionTransformer"))
    ]
    assert not long, f"{path.name}: {long} run past 50 lines"


def test_train_py_reads_in_one_sitting():
    """train.py is the loop (settings, data, models, training, validation, evaluation, fine-tuning, report) in at most
    400 lines; what checks received files, resume state and folders lives in vit_rope/training/."""
    assert len((ROOT / "train.py").read_text().splitlines()) <= 400


@pytest.mark.parametrize("path", [ROOT / "train.py", *sorted((ROOT / "vit_rope" / "training").glob("*.py"))],
                         ids=lambda p: p.name)  # fmt: skip
def test_settings_are_read_by_attribute(path):
    subscripts = [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("settings", "cfg")
    ]
    assert not subscripts, f"{path.name} reads settings by key at lines {subscripts}"


def test_the_readmes_family_table_is_the_registrys():
    """Every built-in family is in the README's table under its names, with the extrapolation modes it declares, and
    the table names no other."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| `family` / `pos_embed` |") :].split("\n\n")[0].splitlines()[2:]
    listed = {}
    for row in table:
        cells = [c.strip() for c in row.strip("|").split("|")]
        modes = tuple(SCALING_MODES) if cells[-1] == "all five" else tuple(m.strip() for m in cells[-1].split(","))
        for name in re.findall(r"`(\w+)`", cells[0]):
            listed[name] = modes
    built_in = {n: f for n, f in FAMILIES.items() if f.__module__.startswith("vit_rope.")}
    names = set(built_in) | {f.model_name for f in built_in.values() if f.model_name}
    assert set(listed) == names
    for name, family in built_in.items():
        assert set(listed[name]) == set(family.scaling_modes), name


def test_every_readme_snippet_runs_as_written(tmp_path):
    """The README's Python blocks, in order and in one namespace (as a reader runs them), in a fresh interpreter
    outside the checkout: each one runs as written."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 4  # the layer, a model, a family of your own, native resolution
    script = tmp_path / "readme.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def anchors(page: Path) -> set[str]:
    """The #fragments GitHub gives ``page``'s headings: lower case, spaces as hyphens, all but letters, digits, _
    and - dropped (× and – too), a repeated one numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    """Each relative link (and image) of README.md and docs/*.md names a file that exists, and a heading of it where
    the link names one (#fragment)."""
    path = ROOT / page
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", path.read_text()) if "://" not in t]
    files = {t: path.parent / t.split("#")[0] if t.split("#")[0] else path for t in targets}
    missing = [t for t, file in files.items() if not file.exists()]
    assert not missing, f"{page} links to missing files: {missing}"
    lost = [t for t, file in files.items() if "#" in t and t.split("#", 1)[1] not in anchors(file)]
    assert not lost, f"{page} links to headings that are not there: {lost}"


@pytest.mark.parametrize("page", PAGES)
def test_no_wrapped_line_starts_a_list_by_accident(page):
    """A paragraph wrapped so that a line begins with "+ " or "* " (RoPE-Mixed + APE, 2 * 3) renders as a list item
    in Markdown: the pages write their lists with "-" and numbers, so such a line is a wrap to move."""
    text = re.sub(r"```.*?```", "", (ROOT / page).read_text(), flags=re.S)
    stray = [line for line in text.splitlines() if re.match(r"\s*[+*]\s", line)]
    assert not stray, f"{page}: lines that Markdown reads as list items: {stray}"
