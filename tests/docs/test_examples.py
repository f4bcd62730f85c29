"""Every example a newcomer is shown runs as written: the ``probe`` lines of the README's fenced
blocks, its Python block, and the examples of every verb's ``--help``.

One folder is a newcomer's first hour: the README's lines in order (its servers left running,
its ``&`` training job stopped once its lines are done), then the ``--help`` examples, which read
what the README's ``probe demo`` and monitor lines made. What is substituted is only what a test must change
(tests/docs/examples.py): the tiny preset, small step counts, free ports; servers are stopped
once they say they listen and answer. Each line must exit 0 (or the code its help documents for
that case) and print no traceback.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.docs.examples import Workspace, help_examples, help_pages, readme_examples, readme_python

#: the exit code an example's own help documents for it, where that is not 0
DOCUMENTED_RC = {
    # "1 something does [differ]": the two runs were trained with different seeds
    "probe config-check runs/s0 runs/s1 --out check.json": 1,
}
#: what the --help examples read that no example before them writes: a user's two dumps
USER_FILES = {"probe compare ms/step0/rank0/dump.json torch/step0/rank0/dump.json --out cmp":
              {"ms": "mindspore_L0", "torch": "torch_L0"}}


@pytest.fixture(scope="module")
def first_hour(tmp_path_factory):
    """The README's lines run in order in one folder; yields the workspace, servers running."""
    ws = Workspace(tmp_path_factory.mktemp("first-hour"), env={"UNTRUSTED_SQL": "select step, loss from steps"})
    try:
        for line in readme_examples():
            ws.run(line)
        ws.stop_jobs()               # the live training job: its part of the README is done
        yield ws
    finally:
        ws.close()
        print("\nexamples, seconds each:\n" + ws.timings())


def test_the_readme_and_every_help_page_show_examples():
    readme = readme_examples()
    assert len(readme) >= 15 and any(" -- examples/train.py" in x for x in readme)
    pages = {page for page, _ in help_examples()}
    for verb in ("train", "compare", "profile", "web", "query", "check-api", "simulate", "config-check"):
        assert f"probe {verb}" in pages, f"probe {verb} --help shows no example"
    assert set(help_pages()) >= {"probe", "probe monitor serve", "probe monitor trace"}


# the README's lines and the --help examples take 3 minutes on an idle 2-core machine; a loaded one
# may take three times that
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_readme_command_line_runs(first_hour):
    assert first_hour.ran and not first_hour.failures(), "\n\n".join(first_hour.failures())


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_help_example_runs(first_hour, msprobe_data):
    ws = first_hour
    before = len(ws.ran)
    for page, line in help_examples():
        for folder, dump in USER_FILES.get(line, {}).items():
            shutil.copytree(msprobe_data / dump / "step0" / "proc0", ws.folder / folder / "step0" / "rank0")
        ws.run(line, expect_rc=DOCUMENTED_RC.get(line, 0))
    ran = ws.ran[before:]
    assert ran
    failed = [f for f in ws.failures() if any(f.startswith(r.step.line + "\n") for r in ran)]
    assert not failed, "\n\n".join(failed)


def test_the_readme_python_block_runs_as_written(tmp_path):
    (block,) = readme_python()
    p = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "l2norm" in p.stdout              # the DuckDB table it prints last


def test_the_example_finders_and_substitutions_do_what_their_docstrings_say():
    import doctest

    import tests.docs.examples as examples

    assert doctest.testmod(examples).failed == 0
