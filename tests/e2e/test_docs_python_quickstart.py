"""docs/python.md and the README's Python section run, as a reader runs them.

Each page's blocks run in order against a real 3-node cluster that the
test reaches the way the page tells a reader to: `$RAFTSCHED_URL` (its
nodes' URLs) and `$RAFTSCHED_TOKEN` (its admin token; the session's
`admin_token` fixture sets it). The blocks are read by their info strings:

- ```` ```python ````: runs in this process, in one namespace shared by
  the page's blocks (as one `python` session would be). What it prints
  must be exactly the ```` ```text ```` block that follows it, or nothing
  if none does.
- ```` ```python file=NAME ````: a file the reader saves and runs with
  `python NAME`. It is saved into a directory of its own and started in its
  own process there, at that point of the page, and stopped with Ctrl-C
  (SIGINT) once the page's last block has run: it must exit with 0 and
  write nothing to stderr.
- ```` ```text output=NAME ````: everything process NAME printed to stdout,
  by the time it has stopped.

A page that loses its examples fails here too (`EXPECTED`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_support import REPO_ROOT

from raftsched import child_processes
from raftsched.client import Client
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster, wait_for

FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
ATTRIBUTE = re.compile(r"(\w+)=(\S+)")
# Per page: at least this many blocks run here, and these files are run.
EXPECTED = {
    "docs/python.md": (10, {"payments_worker.py"}),
    "README.md": (1, {"worker.py"}),
}
STOP_TIMEOUT_S = 40.0  # the worker's shutdown grace (30 s) and then some

# `python NAME` in NAME's directory, as a child that dies with this test
# process (raftsched.child_processes): the file runs as `__main__`, with its
# directory first on sys.path, as the interpreter runs a script.
_RUN_AS_SCRIPT = (
    "import os, runpy, sys\n"
    "from raftsched.child_processes import die_with_parent\n"
    "die_with_parent()\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path[0] = os.path.dirname(sys.argv[0])\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@dataclass(frozen=True, slots=True)
class Block:
    language: str
    attributes: dict[str, str]
    text: str
    number: int  # 1-based, among the page's fenced blocks

    @property
    def runs_here(self) -> bool:
        return self.language == "python" and not self.attributes

    @property
    def file(self) -> str | None:
        return self.attributes.get("file") if self.language == "python" else None

    @property
    def output_of(self) -> str | None:
        return self.attributes.get("output") if self.language == "text" else None

    @property
    def is_plain_output(self) -> bool:
        return self.language == "text" and not self.attributes


def page_blocks(page: str) -> list[Block]:
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    return [
        Block(language, dict(ATTRIBUTE.findall(info)), body, number)
        for number, (language, info, body) in enumerate(FENCE.findall(text), start=1)
    ]


@dataclass
class Script:
    name: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path


@pytest.mark.parametrize("page", sorted(EXPECTED))
def test_the_page_has_its_examples(page: str) -> None:
    """The conventions hold: every output block belongs to something."""
    blocks = page_blocks(page)
    runs, files = EXPECTED[page]
    assert sum(block.runs_here for block in blocks) >= runs
    assert {block.file for block in blocks if block.file} == files
    for before, block in zip([None, *blocks], blocks, strict=False):
        if block.is_plain_output:
            assert before is not None and before.runs_here, f"block {block.number}: output of what?"
        if block.output_of:
            assert block.output_of in files, f"block {block.number}: no file {block.output_of}"


@pytest.mark.parametrize("page", sorted(EXPECTED))
def test_the_page_runs_against_a_cluster(
    page: str, cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAFTSCHED_URL", ",".join(cluster.urls))
    with Client(cluster.urls) as client:
        # The pages submit jobs with a kind (cluster version 8).
        raised = wait_for(lambda: client.cluster()["cluster_version"] == COMMAND_VERSION_MAX, 30)
        assert raised, client.cluster()
    blocks = page_blocks(page)
    namespace = _namespace(page)
    with _scripts(tmp_path) as scripts:
        for index, block in enumerate(blocks):
            if block.file:
                scripts.append(_start_script(block, tmp_path / "reader"))
            elif block.runs_here:
                following = blocks[index + 1] if index + 1 < len(blocks) else None
                expected = following.text if following and following.is_plain_output else ""
                printed = _run(block, page, namespace)
                assert printed == expected, f"{page}, block {block.number} printed:\n{printed}"
    for script in scripts:
        assert script.process.returncode == 0, _outputs(script)
        assert script.stderr.read_text() == "", _outputs(script)
    outputs = {script.name: script.stdout.read_text() for script in scripts}
    for block in blocks:
        if block.output_of:
            assert outputs[block.output_of] == block.text, _outputs(
                next(s for s in scripts if s.name == block.output_of)
            )


def _namespace(page: str) -> dict[str, object]:
    """The page's blocks share one real module (so that dataclasses and
    pickling find it in sys.modules), as an interactive session would."""
    module = types.ModuleType("docs_" + re.sub(r"\W", "_", page))
    sys.modules[module.__name__] = module
    return module.__dict__


def _run(block: Block, page: str, namespace: dict[str, object]) -> str:
    code = compile(block.text, f"{page} (block {block.number})", "exec")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, namespace)
    return printed.getvalue()


def _start_script(block: Block, directory: Path) -> Script:
    assert block.file is not None
    directory.mkdir(exist_ok=True)
    (directory / block.file).write_text(block.text, encoding="utf-8")
    stdout, stderr = directory / f"{block.file}.stdout", directory / f"{block.file}.stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = child_processes.popen(
            [sys.executable, "-c", _RUN_AS_SCRIPT, str(directory / block.file)],
            env=dict(os.environ), stdout=out, stderr=err,
        )  # fmt: skip
    return Script(block.file, process, stdout, stderr)


@contextlib.contextmanager
def _scripts(directory: Path) -> Iterator[list[Script]]:
    """The page's running scripts; on the way out, Ctrl-C for each."""
    scripts: list[Script] = []
    try:
        yield scripts
    finally:
        for script in scripts:
            if script.process.poll() is None:
                script.process.send_signal(signal.SIGINT)
        for script in scripts:
            try:
                script.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                script.process.kill()
                script.process.wait()
                raise


def _outputs(script: Script) -> str:
    return (
        f"{script.name} exited with {script.process.returncode}\n"
        f"stdout:\n{script.stdout.read_text()}\nstderr:\n{script.stderr.read_text()[-5000:]}"
    )
