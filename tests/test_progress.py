"""The progress thread's task machinery, in one process (tasks without MPI)."""

from __future__ import annotations

import threading
import time

import pytest

from research.comm.asynchronous.progress import LONG_SLEEP, Poll, ProgressThread, Task


class Countdown(Task):
    """Finishes after ``n`` polls; records its start and completion in ``log``."""

    def __init__(self, name: str, n: int, log: list, max_sleep: float = 1e-3):
        self.name, self.n, self.log, self.max_sleep = name, n, log, max_sleep
        self.done = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self.log.append(("start", self.name))

    def poll(self) -> Poll:
        self.n -= 1
        if self.n > 0:
            return Poll.IDLE
        self.log.append(("done", self.name))
        self.done.set()
        return Poll.FINISHED

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done.set()


class Broken(Countdown):
    def poll(self) -> Poll:
        raise ValueError(f"{self.name} broke")


@pytest.fixture
def thread():
    t = ProgressThread("test-progress")
    yield t
    t.close(timeout=5)


def test_tasks_start_in_order_and_run_concurrently(thread):
    log: list = []
    tasks = [Countdown(f"t{i}", n, log) for i, n in enumerate([30, 1, 10, 2])]
    for t in tasks:
        thread.add(t)
    for t in tasks:
        assert t.done.wait(5)
    starts = [name for kind, name in log if kind == "start"]
    assert starts == ["t0", "t1", "t2", "t3"]
    # The long task did not hold up the short ones added after it.
    done = [name for kind, name in log if kind == "done"]
    assert done.index("t1") < done.index("t0") and done.index("t3") < done.index("t0")


def test_an_error_goes_to_fail_and_others_go_on(thread):
    log: list = []
    bad, good = Broken("bad", 1, log), Countdown("good", 3, log)
    thread.add(bad)
    thread.add(good)
    assert bad.done.wait(5) and good.done.wait(5)
    assert isinstance(bad.error, ValueError) and good.error is None


def test_sleep_policy(thread):
    """Capped by the tasks' max_sleep, rising with a long wait, cut by wake_at."""
    now = time.perf_counter()
    fast, slow = Countdown("a", 1, [], max_sleep=50e-6), Countdown("b", 1, [])
    # A fresh wait sleeps no longer than the smallest cap of the active tasks.
    assert thread._timeout([fast, slow], 1.0, now) <= 50e-6
    # A long wait (80 ms so far) tolerates 1/32 of it, up to LONG_SLEEP.
    assert thread._timeout([fast, slow], 1.0, now - 0.08) == pytest.approx(LONG_SLEEP)
    assert 5e-4 <= thread._timeout([fast], 1.0, now - 0.016) < LONG_SLEEP
    # The backoff itself still bounds the sleep.
    assert thread._timeout([fast, slow], 20e-6, now - 0.08) == 20e-6
    # A task due soon cuts it short.
    due = time.perf_counter() + 1e-5
    slow.wake_at = lambda: due
    assert thread._timeout([slow], 1.0, now - 0.08) <= 1e-5


def test_idle_thread_sleeps_and_close_finishes_tasks():
    t = ProgressThread("test-progress-idle")
    time.sleep(0.2)  # a window to observe: with no task the thread must not wake
    # Blocked on its condition variable: no round of polls at all (a count, so a
    # loaded machine cannot fail it the way a CPU-time ceiling could).
    assert t.rounds == 0
    task = Countdown("last", 5, [])
    t.add(task)
    t.close(timeout=5)
    assert task.done.is_set() and not t.thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        t.add(Countdown("late", 1, []))
    t.close()  # idempotent
