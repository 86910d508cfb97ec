"""The README's Python examples run, in order, in one namespace."""

import re
from pathlib import Path

import linrnn


def test_readme_examples_run():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert len(blocks) >= 5
    namespace: dict = {}
    before = set(linrnn.list_mixers())
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)
        assert "sigmoid_gdn" in linrnn.list_cells()  # the README's own cell
    finally:  # the cells the README registers stay out of the other tests
        for name in set(linrnn.list_mixers()) - before:
            linrnn.unregister_cell(name)
