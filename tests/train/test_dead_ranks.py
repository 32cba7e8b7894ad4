"""How a rank that reported nothing is described: a dead Python worker, or a lost executor (Spark's words)."""

from __future__ import annotations

from sparktrain.train.launcher import describe_dead, worker_error

_ECHO = {"rank": 1, "host": "10.0.0.2", "message": "Connection closed by peer [10.0.0.1]:4411",
         "traceback": "Traceback ...\nRuntimeError: Connection closed by peer"}
_LOST = {"message": "ExecutorLostFailure (executor 3 exited unrelated to the running tasks) Reason: worker lost",
         "host": "10.0.0.1", "why": "lost"}
_DIED = {"message": "Python worker exited unexpectedly (crashed)", "host": "10.0.0.1", "why": "died"}


def test_a_lost_executor_is_named_with_its_host_and_spark_reason_not_the_peers_echo():
    err = worker_error(RuntimeError("Job aborted"), _ECHO, died={0: _LOST})
    text = str(err)
    assert text.startswith("training failed on rank 0 (host 10.0.0.1): the executor of rank 0 on 10.0.0.1 was lost: "
                           "ExecutorLostFailure"), text
    assert "elastic=True" in text and "Rank 1's error is only the echo of it" in text
    assert (err.rank, err.host) == (0, "10.0.0.1")


def test_a_dead_python_worker_keeps_its_own_description():
    assert describe_dead(2, _DIED).startswith("the Python worker of rank 2 died: Python worker exited")
    assert "maxFailures" in describe_dead(2, _DIED) and "maxFailures" not in describe_dead(2, _DIED, hint=False)


def test_a_rank_with_its_own_error_is_not_replaced_by_a_lost_peer():
    own = {"rank": 1, "host": "h", "message": "ValueError: bad batch", "traceback": "Traceback\nValueError: bad"}
    err = worker_error(RuntimeError("Job aborted"), own, died={0: _LOST})
    assert str(err).startswith("training failed on rank 1 (host h): ValueError: bad batch") and err.rank == 1
