"""A native runtime's alternate signal stack never outlives its call
(drivepercept/models/onnx/signal_stack.py): OpenVINO's CPU plugin gave the thread on which a
Core first used the CPU a stack of its own, and a Core freed on another thread left it
installed and freed, so the process's next signal crashed it (SIGSEGV)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from drivepercept.models.onnx import openvino
from drivepercept.models.onnx.signal_stack import (
    SIGALTSTACK,
    SS_DISABLE,
    StackT,
    current,
    kept_signal_stack,
)

needs_sigaltstack = pytest.mark.skipif(
    SIGALTSTACK is None, reason="needs Linux's sigaltstack (x86-64, aarch64)"
)
needs_openvino = pytest.mark.skipif(not openvino.installed(), reason="needs openvino")
T = TypeVar("T")
Stacks = tuple[StackT | None, ...]
OFF = StackT(None, SS_DISABLE, 0)


def _on_a_thread_of_its_own(work: Callable[[], T]) -> T:
    """`work()`'s result (or its exception), run on a new thread: pytest's main thread keeps
    its own stack."""
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="signal-stack-test")
    thread.start()
    thread.join(timeout=60)
    if failed:
        raise failed[0]
    assert out, "the thread did not finish"
    return out[0]


def _set(stack: StackT) -> None:
    assert SIGALTSTACK is not None
    assert SIGALTSTACK(ctypes.byref(stack), None) == 0


def _key(stack: StackT | None) -> tuple[int, int, int]:
    assert stack is not None
    return stack.key()


@needs_sigaltstack
def test_a_stack_a_call_sets_is_taken_off_and_the_one_before_put_back() -> None:
    def work() -> tuple[Stacks, int, int]:
        mine = ctypes.create_string_buffer(65536)
        theirs = ctypes.create_string_buffer(32768)
        try:
            # given a thread with a stack of its own
            _set(StackT(ctypes.addressof(mine), 0, len(mine)))
            before = current()
            # when a call in the block sets another one
            with kept_signal_stack():
                _set(StackT(ctypes.addressof(theirs), 0, len(theirs)))
                inside = current()
            after = current()
            # and a block that changes nothing
            with kept_signal_stack():
                pass
            unchanged = current()
        finally:
            _set(OFF)  # before the buffers go
        stacks = (before, inside, after, unchanged)
        return stacks, ctypes.addressof(mine), ctypes.addressof(theirs)

    (before, inside, after, unchanged), mine, theirs = _on_a_thread_of_its_own(work)
    # then inside the block the call's stack was in place, and after it the thread's own
    assert _key(inside) == (theirs, 0, 32768)
    assert _key(before) == _key(after) == _key(unchanged) == (mine, 0, 65536)


@needs_sigaltstack
def test_a_thread_without_a_stack_is_left_without_one() -> None:
    def work() -> Stacks:
        theirs = ctypes.create_string_buffer(32768)
        try:
            before = current()
            with kept_signal_stack():
                _set(StackT(ctypes.addressof(theirs), 0, len(theirs)))
            return before, current()
        finally:
            _set(OFF)

    before, after = _on_a_thread_of_its_own(work)
    assert _key(before)[1] == _key(after)[1] == SS_DISABLE  # none, before and after


def _relu_onnx(path: Path) -> Path:
    """The smallest graph OpenVINO will compile: y = relu(x), x (1, 4) float."""
    onnx = pytest.importorskip("onnx")
    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@needs_sigaltstack
@needs_openvino
def test_compiling_on_openvino_leaves_the_threads_stack_as_it_was(tmp_path: Path) -> None:
    graph = _relu_onnx(tmp_path / "relu.onnx")

    def work() -> tuple[Stacks, list[float]]:
        mine = ctypes.create_string_buffer(65536)
        try:
            # given a thread with a stack of its own
            _set(StackT(ctypes.addressof(mine), 0, len(mine)))
            before = current()
            # when it compiles and runs a graph on OpenVINO (its Core's first use of the
            # CPU, which installed the plugin's stack there) and still holds the session
            session = openvino.OpenVinoSession(graph)
            (y,) = session.run(None, {"x": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)})
            during = current()
            del session
            return (before, during), y.ravel().tolist()
        finally:
            _set(OFF)

    (before, during), y = _on_a_thread_of_its_own(work)
    assert y == [0.0, 2.0, 0.0, 4.0]  # it ran
    # then the thread's stack is its own, not the plugin's (freed with the session)
    assert _key(during) == _key(before)


# in a process of its own: the model compiled on the main thread, dropped on another one
# (the case that left the main thread on freed memory: freed on the main thread, the plugin
# puts its stack back itself), then a signal the main thread's handler takes
AFTER_OPENVINO = """
import gc, signal, sys, threading, time
import numpy as np
from drivepercept.models.onnx.openvino import OpenVinoSession
session = OpenVinoSession(sys.argv[1])
session.run(None, {"x": np.zeros((1, 4), np.float32)})
held = [session]
del session
def drop():
    held.clear()
    gc.collect()
dropper = threading.Thread(target=drop)
dropper.start()
dropper.join()
took = []
signal.signal(signal.SIGALRM, lambda signum, frame: took.append(signum))
signal.setitimer(signal.ITIMER_REAL, 0.05)
time.sleep(0.5)
print("signals taken", len(took))
"""


@needs_sigaltstack
@needs_openvino
def test_a_signal_after_an_openvino_model_is_dropped_is_handled_not_a_crash(
    tmp_path: Path,
) -> None:
    # given a process that ran a model on OpenVINO and dropped it on another thread
    # when it then takes a signal its Python handler catches
    graph = _relu_onnx(tmp_path / "relu.onnx")
    proc = subprocess.run(
        [sys.executable, "-c", AFTER_OPENVINO, str(graph)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # then the handler ran and the process went on (it was SIGSEGV, exit -11)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split()[-1] == "1", proc.stdout
