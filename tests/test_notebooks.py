"""Every example notebook runs top to bottom in a fresh kernel (nbclient) with the shipped checkpoints,
and is committed with its outputs cleared."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
CELL_TIMEOUT = 240  # seconds per cell; the notebooks are written to run in well under a minute


def _id(path: Path) -> str:
    return path.stem


def test_examples_exist_and_the_readme_lists_them():
    assert NOTEBOOKS, f"no notebooks in {EXAMPLES}"
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    missing = [nb.name for nb in NOTEBOOKS if nb.name not in readme]
    assert not missing, f"examples/README.md does not mention {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_notebook_is_committed_without_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count is not None)
    ]
    assert not dirty, (
        f"{path.name}: code cells {dirty} have outputs or execution counts; clear them before committing "
        "(the snippet in examples/README.md does it)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_notebook_executes(path):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}
    )
    before = set(EXAMPLES.rglob("*"))
    try:
        client.execute()
    except CellExecutionError as e:  # the message holds the failing cell's source and traceback
        pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: error outputs {errors}"
    # notebook weight: each bundle goes on the page once, however many views and figures follow
    from plotly.offline import get_plotlyjs

    from interp.visualize import circuitsvis_bundle

    html = "".join(str(o.get("data", {}).get("text/html", "")) for c in code for o in c.outputs)
    for name, bundle in (("circuitsvis", circuitsvis_bundle()), ("plotly", get_plotlyjs())):
        assert html.count(bundle[:300]) <= 1, f"{path.name}: the {name} bundle is inlined more than once"
    written = sorted(str(p.relative_to(EXAMPLES)) for p in set(EXAMPLES.rglob("*")) - before)
    assert not written, f"{path.name} wrote {written} into examples/; write to a temporary directory instead"
