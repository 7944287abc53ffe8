"""A native runtime's alternate signal stack never outlives its call
(drivepercept/models/onnx/signal_stack.py): OpenVINO's CPU plugin gave the thread that
loaded it a stack of its own and freed it with the plugin, and the process's next signal
crashed it (SIGSEGV)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from drivepercept.models.onnx import openvino
from drivepercept.models.onnx.signal_stack import SIGALTSTACK, StackT, current, kept_signal_stack

needs_sigaltstack = pytest.mark.skipif(SIGALTSTACK is None, reason="needs Linux's sigaltstack")
T = TypeVar("T")
Stacks = tuple[StackT | None, ...]


def _on_a_thread_of_its_own(work: Callable[[], T]) -> T:
    """`work()`'s result, run on a new thread (pytest's main thread keeps its own stack)."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(work()), name="signal-stack-test")
    thread.start()
    thread.join(timeout=30)
    assert out, "the thread did not finish"
    return out[0]


def _key(stack: StackT | None) -> tuple[int, int, int]:
    assert stack is not None
    return stack.key()


@needs_sigaltstack
def test_a_stack_a_call_sets_is_taken_off_and_the_one_before_put_back() -> None:
    def work() -> tuple[Stacks, int, int]:
        assert SIGALTSTACK is not None
        mine = ctypes.create_string_buffer(65536)
        theirs = ctypes.create_string_buffer(32768)
        # given a thread with a stack of its own
        SIGALTSTACK(ctypes.byref(StackT(ctypes.addressof(mine), 0, len(mine))), None)
        before = current()
        # when a call in the block sets another one
        with kept_signal_stack():
            SIGALTSTACK(ctypes.byref(StackT(ctypes.addressof(theirs), 0, len(theirs))), None)
            inside = current()
        after = current()
        # and a block that changes nothing
        with kept_signal_stack():
            pass
        unchanged = current()
        SIGALTSTACK(ctypes.byref(StackT(None, 2, 0)), None)  # off before the buffers go
        stacks = (before, inside, after, unchanged)
        return stacks, ctypes.addressof(mine), ctypes.addressof(theirs)

    (before, inside, after, unchanged), mine, theirs = _on_a_thread_of_its_own(work)
    # then inside the block the call's stack was in place, and after it the thread's own
    assert _key(inside) == (theirs, 0, 32768)
    assert _key(before) == _key(after) == _key(unchanged) == (mine, 0, 65536)


@needs_sigaltstack
def test_a_thread_without_a_stack_is_left_without_one() -> None:
    def work() -> Stacks:
        assert SIGALTSTACK is not None
        theirs = ctypes.create_string_buffer(32768)
        before = current()
        with kept_signal_stack():
            SIGALTSTACK(ctypes.byref(StackT(ctypes.addressof(theirs), 0, len(theirs))), None)
        return before, current()

    before, after = _on_a_thread_of_its_own(work)
    assert _key(before)[1] == _key(after)[1] == 2  # SS_DISABLE: none, before and after


# a process of its own: the CPU plugin is loaded once per process, by its first user
AFTER_OPENVINO = """
import gc, signal, sys, tempfile, time
from pathlib import Path
import torch
from drivepercept.models import load_detector
from drivepercept.models.runtime import RuntimeRequest, choose_runtime
tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
ov = choose_runtime(tiny, RuntimeRequest(runtime="openvino", cache=Path(sys.argv[1])))
assert ov.runtime_choice is not None and ov.runtime_choice.ran == "openvino"
w, h = tiny.input.size
with torch.inference_mode():
    for b in (2, 1):
        ov.module(torch.rand(b, 3, h, w) * 255)
del ov  # the compiled models, and with them the plugin, freed
gc.collect()
took = []
signal.signal(signal.SIGALRM, lambda signum, frame: took.append(signum))
signal.setitimer(signal.ITIMER_REAL, 0.05)
time.sleep(0.5)
print("signals taken", len(took))
"""


@needs_sigaltstack
@pytest.mark.skipif(not openvino.installed(), reason="needs the openvino package")
@pytest.mark.timeout(300)
def test_a_signal_after_an_openvino_model_is_freed_is_handled_not_a_crash(
    tmp_path: Path,
) -> None:
    # given a process that ran a model on OpenVINO and freed it
    # when it then takes a signal its Python handler catches
    proc = subprocess.run(
        [sys.executable, "-c", AFTER_OPENVINO, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # then the handler ran and the process went on (it was SIGSEGV, exit -11)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split()[-1] == "1", proc.stdout
