"""Every command in README.md and docs/*.md runs, and exits as the docs say.

What a command is
    Fenced blocks tagged ``sh``, ``bash`` or ``console`` hold commands (in ``console`` only
    the ``$ `` lines). A line starting with ``drivepercept ``, ``python `` or ``python3 ``,
    with its ``\\`` continuation lines, is one test case, named by file and line
    (``README.md:57``, ``docs/LIVE.md:12``). A ``python`` block is one case, run as a script.
    Any other line of a block is a shell line the commands need: a variable assignment
    (``W=...``) holds for every later command of its block; any other line (``printf ... >
    replay.toml``) runs just before the next command.

Where it runs
    Each block runs in a folder of its own, never in the checkout: ``<tmp>/<block>/main`` is
    the working directory, with ``sample_videos`` (a copy made once per session),
    ``scripts`` and ``models`` (links to the repository's), and ``<tmp>/<block>/shared``
    links to ../shared where the tests find it (`tests/thirdparty.py`), so that
    ``../shared/...`` reads as it does from the repository root. Paths under ``/tmp/`` are
    rewritten into ``<tmp>/<block>/tmp/``; the ports of ``--port N``, ``--metrics-port N``
    and ``127.0.0.1:N`` are replaced by free ones. The commands of a block run in order in
    that one folder, so a block is self-contained: a case first runs the earlier commands of
    its block that have not run (``-k`` or ``-m`` may have deselected them). A command
    ending in ``&`` runs in the background (its ``--port`` waited for) until the block's last
    command has run.

Offline
    HOME is a fresh folder (no cached weights: a command that needs ``DEFAULT`` weights
    downloads), HTTP(S) proxies point at a closed port (a download fails at once; loopback
    is exempt), and there is no display. Every example that must run offline therefore
    names its model and weights (``--model drivepercept-tiny``, or ``--weights
    ../shared/models/...``); one that downloads is marked ``network``.

Markers
    ``<!-- docs-test: TERMS -->`` on the line(s) directly before a fence applies to every
    command of its block; a trailing ``# docs-test: TERMS`` comment applies to its line.
    TERMS, separated by commas:

    - ``gpu``: needs CUDA; the `cuda` marker, skipped without a GPU;
    - ``network``: downloads; always skipped, since these tests run offline;
    - ``slow``: the `slow` marker (the default run leaves it out); every other command must
      take a few seconds, so shrink it (``--max-frames``, ``--frames``) or mark it;
    - ``shared``: reads ../shared. A command whose text names ``../shared`` gets it without
      the term. The `shared` marker; skipped where ../shared is absent or hidden
      (``DRIVEPERCEPT_TEST_SHARED=none``);
    - ``exit N``: the exit code the docs promise (default 0);
    - ``skip REASON``: not run, for that reason (the rest of the comment): ``pip install``
      set-up lines, placeholders, hardware that is not here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import pytest

# the module, not its names: conftest marks every test of a module holding them `shared`,
# and here only the cases that read ../shared are
import thirdparty

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
# what the docs call ../shared, linked beside each block's main/ to where the fixtures are
DOCS_SHARED = "shared"
LINKED = ("scripts", "models")  # read-only folders a command may name (sample_videos: copied)

SHELL_TAGS = frozenset({"sh", "bash", "console", "shell"})
PYTHON_TAGS = frozenset({"python", "py"})
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<tag>[\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:(?P<terms>.*?)-->\s*$")
TRAILING = re.compile(r"#\s*docs-test:(?P<terms>.*)$")
COMMAND = re.compile(r"^(drivepercept|python3?)(\s|$)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PORT = re.compile(r"(?:--(?:metrics-)?port[ =]|(?:127\.0\.0\.1|localhost):)(\d{2,5})\b")
BACKGROUND = re.compile(r"&\s*(#.*)?$")  # `cmd &`, perhaps with a comment after it
TMP = re.compile(r"(?<![\w./~-])/tmp(?=/|\s|$)")
FLAGS = frozenset({"gpu", "network", "slow", "shared"})

QUICK_TIMEOUT_S = 240  # a command not marked slow
SLOW_TIMEOUT_S = 1200
CLOSED_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, a download fails at once


@dataclass(frozen=True)
class Marks:
    """What the docs say about a command: see the module docstring."""

    gpu: bool = False
    network: bool = False
    slow: bool = False
    shared: bool = False
    exit_code: int | None = None  # None: 0
    skip: str | None = None

    @property
    def expected_exit(self) -> int:
        return self.exit_code or 0

    def merged(self, other: Marks) -> Marks:
        """These marks with a line's own on top (flags add up; its exit code and skip win)."""
        return Marks(
            gpu=self.gpu or other.gpu,
            network=self.network or other.network,
            slow=self.slow or other.slow,
            shared=self.shared or other.shared,
            exit_code=self.exit_code if other.exit_code is None else other.exit_code,
            skip=other.skip or self.skip,
        )


def parse_marks(terms: str) -> tuple[Marks, list[str]]:
    """`gpu, slow`, `exit 2`, `skip REASON, WITH COMMAS` -> Marks, and the terms not known."""
    skip = None
    head, found, reason = re.sub(r"\s+", " ", terms).partition("skip")
    if found and (not head.strip() or head.rstrip().endswith(",")):
        skip, terms = reason.strip(" :-") or "marked skip", head
    flags: dict[str, bool] = {}
    exit_code: int | None = None
    unknown: list[str] = []
    for term in filter(None, (t.strip() for t in terms.split(","))):
        if term in FLAGS:
            flags[term] = True
        elif (m := re.fullmatch(r"exit (\d+)", term)) is not None:
            exit_code = int(m.group(1))
        else:
            unknown.append(term)
    return Marks(**flags, exit_code=exit_code, skip=skip), unknown


@dataclass
class Block:
    """One fenced block of commands, where it is and how it is marked."""

    doc: str
    line: int  # of the fence
    marks: Marks
    commands: list[Command] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return f"{self.doc.replace('/', '_')}-{self.line}"


@dataclass(frozen=True)
class Command:
    """One test case: a command and the shell lines it needs."""

    block: Block = field(repr=False, compare=False)
    index: int  # in its block
    line: int
    text: str  # as written, continuation lines joined by newlines
    assignments: tuple[str, ...] = ()  # the block's assignments before it
    setup: tuple[str, ...] = ()  # the other shell lines just before it
    marks: Marks = Marks()
    python: bool = False  # a python block, run as a script

    @property
    def id(self) -> str:
        return f"{self.block.doc}:{self.line}"

    @property
    def background(self) -> bool:
        return not self.python and BACKGROUND.search(self.text) is not None

    @property
    def script(self) -> str:
        text = BACKGROUND.sub("", self.text) if self.background else self.text
        return "\n".join((*self.assignments, *self.setup, text))

    def why_not_run(self) -> str | None:
        """Why this command is not run here, or None."""
        if self.marks.skip:
            return f"docs-test skip: {self.marks.skip}"
        if self.marks.network:
            return "docs-test network: these tests run offline"
        if self.marks.gpu and not cuda_available():
            return "docs-test gpu: needs CUDA"
        if self.marks.shared and not thirdparty.present(thirdparty.SHARED):
            return f"reads ../shared, not found at {thirdparty.SHARED}"
        return None


@dataclass
class Collected:
    commands: list[Command] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _logical_lines(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """(first line number, text) with `\\` continuations joined."""
    pending: list[str] = []
    start = 0
    for number, text in lines:
        if not pending:
            start = number
        pending.append(text)
        if not text.rstrip().endswith("\\"):
            yield start, "\n".join(pending)
            pending = []
    if pending:
        yield start, "\n".join(pending)


def _block_commands(block: Block, tag: str, body: list[tuple[int, str]], out: Collected) -> None:
    """The commands of a shell block, each with the assignments and set-up lines it needs."""
    assignments: list[str] = []
    setup: list[str] = []
    if tag == "console":  # only the prompt lines; the rest is output
        body = [(n, t[2:]) for n, t in body if t.startswith("$ ")]
    for number, text in _logical_lines(body):
        bare = text.strip()
        if not bare or bare.startswith("#"):
            continue
        trailing = TRAILING.search(text.splitlines()[-1])
        marks, unknown = parse_marks(trailing["terms"]) if trailing else (Marks(), [])
        out.problems += [f"{block.doc}:{number}: unknown docs-test term {u!r}" for u in unknown]
        if COMMAND.match(bare):
            command = Command(
                block=block,
                index=len(block.commands),
                line=number,
                text=text,
                assignments=tuple(assignments),
                setup=tuple(setup),
                marks=block.marks.merged(marks),
            )
            _add(command, out)
            setup = []
        elif ASSIGNMENT.match(bare):
            assignments.append(text)
        else:
            setup.append(text)
    if setup and not block.marks.skip:
        out.problems.append(
            f"{block.doc}:{block.line}: shell lines after the block's last command are never "
            f"run: {setup[0]!r}"
        )


def _add(command: Command, out: Collected) -> None:
    """Adds a command to its block and to the cases, with the needs its text shows."""
    if "../shared" in command.script and not command.marks.shared:
        command = replace(command, marks=replace(command.marks, shared=True))
    if "pip install" in command.text and not command.marks.skip:
        out.problems.append(f"{command.id}: `pip install` is set-up: mark it skip")
    command.block.commands.append(command)
    out.commands.append(command)


def collect(doc: str, text: str, out: Collected) -> None:
    """The commands of one Markdown file (`doc`, its path in the repository), and what is
    wrong with its markers and blocks."""
    lines = text.splitlines()
    pending: list[tuple[int, str]] = []  # marker lines waiting for their fence
    k = 0
    while k < len(lines):
        number, text = k + 1, lines[k]
        if (marker := MARKER.match(text)) is not None:
            pending.append((number, marker["terms"]))
            k += 1
            continue
        opened = FENCE.match(text)
        if opened is None:
            out.problems += [
                f"{doc}:{n}: a docs-test marker not directly before a fence" for n, _ in pending
            ]
            pending = []
            k += 1
            continue
        indent, fence, tag = len(opened["indent"]), opened["fence"], opened["tag"].lower()
        body: list[tuple[int, str]] = []
        k += 1
        closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while k < len(lines) and not closing.match(lines[k]):
            line = lines[k]
            body.append((k + 1, line[indent:] if not line[:indent].strip() else line.lstrip()))
            k += 1
        k += 1  # the closing fence
        marks = Marks()
        for where, terms in pending:
            found, unknown = parse_marks(terms)
            marks = marks.merged(found)
            out.problems += [f"{doc}:{where}: unknown docs-test term {u!r}" for u in unknown]
        pending = []
        block = Block(doc=doc, line=number, marks=marks)
        if tag in SHELL_TAGS:
            _block_commands(block, tag, body, out)
        elif tag in PYTHON_TAGS:
            code = "\n".join(t for _, t in body) + "\n"
            _add(Command(block, 0, number + 1, code, marks=marks, python=True), out)
        elif not marks.skip and any(COMMAND.match(t.strip()) for _, t in body):
            out.problems.append(
                f"{doc}:{number}: a block with commands is tagged {tag or 'nothing'}: tag it sh "
                "(so that it is run) or mark it <!-- docs-test: skip REASON -->"
            )
    out.problems += [f"{doc}:{n}: a docs-test marker at the end of the file" for n, _ in pending]


def collect_all() -> Collected:
    out = Collected()
    for path in DOCS:
        collect(path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8"), out)
    return out


COLLECTED = collect_all()


@cache
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# --- running them ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends a command and everything it started (it leads its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its group
    proc.wait(timeout=15)


@dataclass
class BlockRun:
    """A block's folder, its ports and background commands, and what has run in it."""

    main: Path
    tmp: Path
    ports: dict[str, str]
    outcomes: dict[int, str | None] = field(default_factory=dict)  # index -> failure or None
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def rewrite(self, script: str) -> str:
        script = TMP.sub(str(self.tmp), script)
        for given, free in self.ports.items():
            script = re.sub(rf"\b{given}\b", free, script)
        return script

    def stop_background(self) -> None:
        for proc in self.background:
            _stop(proc)
        self.background.clear()


class Workspace:
    """The session's folder of block folders, and the environment the commands run in."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[str, BlockRun] = {}
        samples = root / "repo" / "sample_videos"
        shutil.copytree(REPO / "sample_videos", samples)
        self.samples = samples
        self.bin = root / "bin"
        self.bin.mkdir()
        # the interpreter running the tests, whatever PATH says (and pyenv shims need HOME)
        for name, line in (
            ("python", f'exec "{sys.executable}" "$@"'),
            ("python3", f'exec "{sys.executable}" "$@"'),
            ("drivepercept", f'exec "{sys.executable}" -m drivepercept "$@"'),
        ):
            shim = self.bin / name
            shim.write_text(f"#!/bin/sh\n{line}\n")
            shim.chmod(0o755)
        self.home = root / "home"
        self.home.mkdir()

    def env(self, environ: dict[str, str]) -> dict[str, str]:
        """The commands' environment: this one, offline, without a display, HOME fresh."""
        env = dict(environ)
        for name in (
            "DISPLAY",
            "WAYLAND_DISPLAY",
            "XDG_CACHE_HOME",
            "TORCH_HOME",
            "DRIVEPERCEPT_WEIGHTS_DIR",
            "DRIVEPERCEPT_WEIGHTS_MIRROR",
        ):
            env.pop(name, None)
        env["HOME"] = str(self.home)
        # the Python API's default export cache is ~/.cache/drivepercept/onnx: the session's
        # (tests/conftest.py), as the CLI's, so that a model is exported once
        cache = self.home / ".cache" / "drivepercept" / "onnx"
        if "DRIVEPERCEPT_ONNX_CACHE" in env and not cache.is_symlink():
            Path(env["DRIVEPERCEPT_ONNX_CACHE"]).mkdir(parents=True, exist_ok=True)
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.symlink_to(env["DRIVEPERCEPT_ONNX_CACHE"])
        env["PYTHONUSERBASE"] = site.getuserbase()  # user-site packages stay importable
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["MPLBACKEND"] = "Agg"
        for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            env[name] = CLOSED_PROXY
        env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"
        env["grpc_proxy"] = ""  # gRPC (Ray) would take http_proxy too; empty: no proxy
        return env

    def block(self, block: Block) -> BlockRun:
        run = self.runs.get(block.slug)
        if run is None:
            folder = self.root / block.slug
            main, tmp = folder / "main", folder / "tmp"
            main.mkdir(parents=True)
            tmp.mkdir()
            (main / "sample_videos").symlink_to(self.samples)
            for name in LINKED:
                (main / name).symlink_to(REPO / name)
            if thirdparty.present(thirdparty.SHARED):
                (folder / DOCS_SHARED).symlink_to(thirdparty.SHARED)
            given = {p for c in block.commands if not c.python for p in PORT.findall(c.text)}
            ports = {port: str(_free_port()) for port in sorted(given)}
            run = self.runs[block.slug] = BlockRun(main=main, tmp=tmp, ports=ports)
        return run

    def close(self) -> None:
        for run in self.runs.values():
            run.stop_background()


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    space = Workspace(tmp_path_factory.mktemp("docs"))
    try:
        yield space
    finally:
        space.close()


def _tail(text: str, limit: int = 3000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def _wait_for_ports(proc: subprocess.Popen[bytes], ports: list[int], log: Path) -> str | None:
    """Waits until a background command listens on its ports; its failure, or None."""
    deadline = time.monotonic() + 90
    for port in ports:
        while True:
            if proc.poll() is not None:
                return (
                    f"exited {proc.returncode}, not listening on {port}:\n{_tail(log.read_text())}"
                )
            with socket.socket() as s:
                s.settimeout(1.0)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                return f"not listening on {port} after 90 s:\n{_tail(log.read_text())}"
            time.sleep(0.2)
    return None


def execute(command: Command, run: BlockRun, env: dict[str, str]) -> str | None:
    """Runs one command in its block's folder; why it failed, or None."""
    script = run.rewrite(command.script)
    if command.python:
        path = run.main / f"docs_example_{command.line}.py"
        path.write_text(script)
        argv = [sys.executable, path.name]
    else:
        argv = ["bash", "-c", script]
    if command.background:
        log = run.tmp / f"background-{command.line}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                argv, cwd=run.main, env=env, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        run.background.append(proc)
        ports = [int(p) for p in re.findall(r"--port[ =](\d+)", script)]
        return _wait_for_ports(proc, ports, log)
    timeout = SLOW_TIMEOUT_S if command.marks.slow else QUICK_TIMEOUT_S
    proc = subprocess.Popen(
        argv, cwd=run.main, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        out, err = proc.communicate()
        return f"still running after {timeout} s:\n{_tail(err.decode(errors='replace'))}"
    finally:
        _stop(proc)  # what it left behind in its group
    if proc.returncode != command.marks.expected_exit:
        return (
            f"exit {proc.returncode}, the docs promise {command.marks.expected_exit}\n"
            f"$ {script}\n--- stdout\n{_tail(out.decode(errors='replace'))}\n"
            f"--- stderr\n{_tail(err.decode(errors='replace'))}"
        )
    return None


def _params() -> Iterator[object]:
    for command in COLLECTED.commands:
        marks: list[pytest.MarkDecorator] = []
        if command.marks.slow:
            marks += [pytest.mark.slow, pytest.mark.timeout(SLOW_TIMEOUT_S + 120)]
        else:
            marks.append(pytest.mark.timeout(QUICK_TIMEOUT_S + 120))
        if command.marks.gpu:
            marks.append(pytest.mark.cuda)
        if command.marks.shared:
            marks.append(pytest.mark.shared)
        if command.marks.skip or command.marks.network:
            marks.append(pytest.mark.skip(reason=command.why_not_run() or ""))
        yield pytest.param(command, id=command.id, marks=marks)


@pytest.mark.integration
@pytest.mark.parametrize("command", _params())
def test_documented_command_runs(command: Command, workspace: Workspace) -> None:
    # given the block's folder, with the block's earlier commands run
    if (why := command.why_not_run()) is not None:
        pytest.skip(why)
    run = workspace.block(command.block)
    env = workspace.env(dict(os.environ))
    for earlier in command.block.commands[: command.index]:
        if earlier.index not in run.outcomes and earlier.why_not_run() is None:
            run.outcomes[earlier.index] = execute(earlier, run, env)
        if run.outcomes.get(earlier.index):
            run.stop_background()
            pytest.fail(f"{earlier.id}, which this command follows, failed (see that case)")
    # when it runs (or ran already, as an earlier command of a later one of its block: in
    # random order the block's last case may come first and stop the block's background
    # server, so running this one again would find no server)
    try:
        if command.index in run.outcomes:
            failure = run.outcomes[command.index]
        else:
            failure = run.outcomes[command.index] = execute(command, run, env)
    finally:
        if command.index == len(command.block.commands) - 1:
            run.stop_background()
    # then it exits as the docs say
    assert failure is None, f"{command.id}: {failure}"


def test_docs_blocks_are_understood() -> None:
    """Every marker is known and stands before a fence, and no command escapes the test: a
    command in an untagged block, or a shell line after a block's last command, is an error."""
    assert COLLECTED.problems == []


def test_docs_commands_are_found() -> None:
    """The extraction itself works: the README's tour and every guide with examples."""
    docs = {c.block.doc for c in COLLECTED.commands}
    assert "README.md" in docs
    assert {"docs/REPLAY.md", "docs/LIVE.md", "docs/MODELS.md", "docs/EVALUATION.md"} <= docs
    python = [c for c in COLLECTED.commands if c.python]
    assert python, "no python block found"


def test_markers_parse() -> None:
    assert parse_marks(" gpu, slow ") == (Marks(gpu=True, slow=True), [])
    assert parse_marks(" exit 2 ") == (Marks(exit_code=2), [])
    assert parse_marks(" network, skip needs a, b and c ") == (
        Marks(network=True, skip="needs a, b and c"),
        [],
    )
    assert parse_marks(" fast ") == (Marks(), ["fast"])


def test_a_block_is_split_into_commands() -> None:
    # given a block with an assignment, a set-up line, a continued command and markers
    text = (
        "<!-- docs-test: slow -->\n"
        "```sh\n"
        "W=../shared/w.onnx\n"
        "printf 'a' > f.toml\n"
        "drivepercept replay a.mp4 \\\n"
        "    --weights $W\n"
        "drivepercept report runs/x   # docs-test: exit 3\n"
        "```\n"
        "```\n"
        "drivepercept replay b.mp4\n"
        "```\n"
    )
    # when it is collected
    out = Collected()
    collect("x.md", text, out)
    # then each command is a case with what it needs, and the untagged block is an error
    first, second = out.commands
    assert (first.id, first.setup) == ("x.md:5", ("printf 'a' > f.toml",))
    assert first.script == (
        "W=../shared/w.onnx\nprintf 'a' > f.toml\ndrivepercept replay a.mp4 \\\n    --weights $W"
    )
    assert first.marks == Marks(slow=True, shared=True)
    assert (second.id, second.setup, second.assignments) == ("x.md:7", (), ("W=../shared/w.onnx",))
    assert second.marks == Marks(slow=True, shared=True, exit_code=3)
    assert [p.split(":")[1] for p in out.problems] == ["9"]
