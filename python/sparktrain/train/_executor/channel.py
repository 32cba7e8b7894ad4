"""The progress channel's protocol, shared by the driver's server and the workers' :class:`Reporter`.

JSON lines over one TCP connection per worker process, opened by the worker:

1. **hello** (worker -> driver), the first line, within :data:`HELLO_S` seconds:
   ``{"hello": 2, "token": T, "client": C, "rank": r, "host": h}``.  The driver
   compares ``T`` with the launch's token in constant time
   (:func:`hmac.compare_digest`) and drops the connection on a wrong, missing or
   stale token.  ``C`` names the worker process: a reconnect replaces the
   client's older connection.
2. **events** (worker -> driver), one a line: ``{"type": "step" | "epoch" |
   "heartbeat" | "device" | "error" | "world_size" | "ping", "rank", "host",
   "run", ...}``.  A connection that sends nothing for :data:`READ_TIMEOUT_S` is
   closed; an idle worker sends a ``ping`` every :data:`PING_S`.
3. **requests** (worker -> driver): ``{"type": "request", "id": n, "op": ..., ...}``;
   the driver answers on the same connection, at once or when it knows:
   ``{"reply": n, "value": ...}``.  A worker re-sends every unanswered request
   after a reconnect, so every operation is idempotent on the driver.  The
   operations: ``verdict`` (rank 0 of a pruned search's trial, after an epoch,
   with the epoch's metrics: go on or stop) and ``next`` (a rank of a reused
   gang: the result of the trial it finished, and the next trial to run).

A payload the driver sends for execution (a gang's next trial: a pickled
:class:`~sparktrain.train._executor.spec.WorkerSpec`) is signed with the token
(HMAC-SHA256); a worker unpickles only what verifies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import pickle
from typing import Any, Dict

#: the hello line's protocol version
VERSION = 2
#: seconds a new connection has to send its hello line (with the token)
HELLO_S = 5.0
#: seconds a connection may send nothing before the driver closes it
READ_TIMEOUT_S = 30.0
#: seconds of silence after which a worker sends a ping: keeps its connection under READ_TIMEOUT_S, and a rank
#: without a heartbeat yet (importing its framework, in its rendezvous) inside the driver's SILENT_S (5 s) and a
#: reused gang's ALIVE_S (2.5 s), so it is not taken for a lost process
PING_S = 1.0


def token_ok(given: Any, token: str) -> bool:
    """Whether ``given`` is ``token``, compared in constant time."""
    if not isinstance(given, str) or not token:
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def sign(obj: Any, token: str) -> Dict[str, str]:
    """``obj`` pickled, as JSON-safe base64 with its HMAC-SHA256 under ``token``."""
    body = pickle.dumps(obj)
    mac = hmac.new(token.encode(), body, hashlib.sha256).hexdigest()
    return {"body": base64.b64encode(body).decode("ascii"), "mac": mac}


def unsign(signed: Dict[str, str], token: str) -> Any:
    """The object :func:`sign` packed; raises ``ValueError`` when its signature does not verify."""
    body = base64.b64decode(signed["body"])
    mac = hmac.new(token.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, str(signed.get("mac", ""))):
        raise ValueError("a payload on the progress channel failed its signature check: not unpickled")
    return pickle.loads(body)
