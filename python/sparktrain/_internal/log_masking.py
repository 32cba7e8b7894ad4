"""Secrets out of log records: a filter for log handlers, installed once where logging is configured.

The CLI calls :func:`install_log_masking` right after ``logging.basicConfig``;
a notebook or an application that configures logging itself calls it after
that (it is exported as ``sparktrain.track.install_log_masking``).  The
filter sits on the handlers, not on the ``sparktrain`` logger: a filter on a
logger does not see the records of its children, and on the handlers it also
masks what MLflow, py4j or any other library logs through them.
"""

from __future__ import annotations

import logging

from sparktrain._internal.secrets import mask_value


class SecretFilter(logging.Filter):
    """A logging filter that masks the message, the traceback and the stack of every record it sees.

    Attach it to handlers (a filter on a logger does not see its children's
    records); :func:`install_log_masking` does so.  It never drops a record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logging's to report, not ours
            return True
        masked = mask_value(message)
        if masked != message:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_value(record.exc_text)
        if record.stack_info:
            record.stack_info = mask_value(record.stack_info)
        return True


def install_log_masking(logger: "logging.Logger | None" = None) -> int:
    """Add one :class:`SecretFilter` to every handler of ``logger`` (default: the root logger) and of the
    ``sparktrain`` logger; idempotent.

    Returns how many handlers got it.  Call it after logging is configured
    (the CLI does, after ``logging.basicConfig``); a handler added later is not covered.
    """
    target = logger or logging.getLogger()
    added = 0
    for handler in [*target.handlers, *logging.getLogger("sparktrain").handlers]:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(SecretFilter())
            added += 1
    return added


__all__ = ["SecretFilter", "install_log_masking"]
