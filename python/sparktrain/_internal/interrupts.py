"""Ctrl-C on a driver that waits in a py4j call: cancel the Spark jobs, then interrupt outside py4j's I/O.

PySpark's SIGINT handler calls ``cancelAllJobs`` on the main thread.  When
Ctrl-C lands while that thread waits inside a py4j call (a ``collect``, a
gang's barrier stage), the nested call reuses the waiting socket and fails
(``RuntimeError: reentrant call inside BufferedReader``): py4j tracebacks,
and a ``Py4JError`` where a ``KeyboardInterrupt`` belongs.  Raising in the
middle of the socket read is no better: py4j then closes that socket while
other calls race it, and a later call can fail with ``Py4JNetworkError``.

:func:`cancel_off_the_main_thread` swaps it, on sessions sparktrain builds,
for a handler that never cuts py4j's socket I/O.  Outside it, the handler
raises :class:`KeyboardInterrupt` at once and cancels the jobs from a helper
thread.  Inside it, a helper thread cancels the jobs (which ends the call),
and the interrupt is raised at the first line the main thread runs outside
py4j's I/O (a trace function, set only until then).  A second Ctrl-C, or a
call still running :data:`FORCE_AFTER_S` after the cancel, is interrupted
where it stands.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, Optional

log = logging.getLogger(__name__)

#: after this long, a py4j call the cancel did not end is interrupted where it stands
FORCE_AFTER_S = 10.0
_PY4J = os.sep + "py4j" + os.sep
_state: Dict[str, Any] = {"armed": False, "force": False, "trace": None}


def cancel_off_the_main_thread(sc: Any) -> None:
    """Replace PySpark's SIGINT handler with one that never interrupts py4j's socket I/O (module docstring).

    Only PySpark's own handler is replaced (a notebook's or the user's stays),
    and only from the main thread (where Python runs signal handlers).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if not str(getattr(signal.getsignal(signal.SIGINT), "__module__", "")).startswith("pyspark"):
        return

    def on_interrupt(signum: int, frame: Any) -> None:
        if _state["armed"] or _state["force"] or not _in_io(frame):  # a second Ctrl-C, the force, or safe here
            forced = _state["armed"] or _state["force"]
            _disarm()
            if not forced:
                threading.Thread(target=_cancel, args=(sc,), name="sparktrain-cancel-jobs", daemon=True).start()
            raise KeyboardInterrupt()
        _arm(frame)
        threading.Thread(target=_cancel_then_force, args=(sc,), name="sparktrain-cancel-jobs", daemon=True).start()

    signal.signal(signal.SIGINT, on_interrupt)


def _in_io(frame: Any) -> bool:
    """Whether ``frame`` (the main thread's) is inside py4j's socket I/O: a ``send_command`` of py4j on its stack
    (the gateway's, which hands the connection back, or the connection's own)."""
    while frame is not None:
        code = frame.f_code
        if _PY4J in code.co_filename and (code.co_name == "send_command" or code.co_filename.endswith(
                "clientserver.py")):
            return True
        frame = frame.f_back
    return False


def _tracer(frame: Any, event: str, arg: Any) -> Optional[Any]:
    """Raise the pending interrupt at the first event outside py4j's I/O."""
    if _state["armed"] and not _in_io(frame):
        _disarm()
        raise KeyboardInterrupt()
    return _tracer


def _arm(frame: Any) -> None:
    """Trace the main thread (its running frames too) until it leaves py4j's I/O."""
    _state.update(armed=True, trace=sys.gettrace())
    while frame is not None:
        frame.f_trace = _tracer
        frame = frame.f_back
    sys.settrace(_tracer)


def _disarm() -> None:
    if _state["armed"]:
        sys.settrace(_state["trace"])
    _state.update(armed=False, force=False, trace=None)


def _cancel(sc: Any) -> bool:
    """``sc.cancelAllJobs()``, tried up to 3 times; whether it went through."""
    for attempt in range(3):
        try:
            sc.cancelAllJobs()
            return True
        except Exception as exc:  # noqa: BLE001 - the JVM may be stopping already
            log.debug("Ctrl-C: cancelling Spark jobs failed (attempt %d): %s", attempt + 1, exc)
            time.sleep(0.5)
    return False


def _cancel_then_force(sc: Any) -> None:
    """Cancel the jobs (the main thread's call then returns); interrupt it where it stands if it has not left
    py4j's I/O :data:`FORCE_AFTER_S` later."""
    _cancel(sc)
    deadline = time.monotonic() + FORCE_AFTER_S
    while _state["armed"] and time.monotonic() < deadline:
        time.sleep(0.1)
    if _state["armed"]:
        log.warning("Ctrl-C: the driver still waits in a Spark call %.0f s after its jobs were cancelled; "
                    "interrupting it", FORCE_AFTER_S)
        _state["force"] = True
        _thread.interrupt_main(signal.SIGINT)


__all__ = ["FORCE_AFTER_S", "cancel_off_the_main_thread"]
