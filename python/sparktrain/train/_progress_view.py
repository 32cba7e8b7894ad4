"""What a person sees of a fit's progress: a tqdm bar on a TTY, log lines elsewhere (the server's display).

Logs under ``sparktrain.train.progress``, the server's logger.
"""

from __future__ import annotations

import logging
from typing import IO, Any, Callable, Dict

log = logging.getLogger("sparktrain.train.progress")


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressView:
    """A bar per epoch when ``stream`` is a TTY and ``show_bar``; else a step log line every ``log_every_s``
    (none without ``show_bar``) and one line per epoch.  Called under the server's lock."""

    def __init__(self, epochs: int, show_bar: bool, log_every_s: float, stream: IO[str],
                 clock: Callable[[], float]) -> None:
        self.bar: Any = None
        self._epochs = epochs
        self._stream = stream
        self.draws_bar = show_bar and _isatty(stream)
        self._log_steps = show_bar and not self.draws_bar
        self._log_every_s = float(log_every_s)
        self._clock = clock
        self._last_log = clock()

    def step(self, event: Dict[str, Any], metrics: Dict[str, Any]) -> None:
        if self.draws_bar:
            self._update_bar(event, metrics)
        elif self._log_steps:
            now = self._clock()
            if now - self._last_log >= self._log_every_s:
                self._last_log = now
                steps = event.get("steps")
                log.info("epoch %d/%d  step %d%s  %.0f samples/s  loss=%.4g%s", event["epoch"] + 1,
                         event.get("epochs", self._epochs), event["step"], f"/{steps}" if steps else "",
                         float(metrics.get("samples_per_s", 0.0)), float(metrics.get("loss", float("nan"))),
                         f"  workers={event['world_size']}" if event.get("world_size") else "")

    def epoch(self, event: Dict[str, Any], metrics: Dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.set_postfix({k: round(v, 4) for k, v in metrics.items()
                                  if k in ("train_loss", "val_loss", "val_auc")})
            self.close()
        summary = "  ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        log.info("epoch %d/%d  %s", event["epoch"] + 1, event.get("epochs", self._epochs), summary)
        self._last_log = self._clock()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _update_bar(self, event: Dict[str, Any], metrics: Dict[str, Any]) -> None:
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover
            return
        step = int(event["step"])
        if self.bar is None:
            # initial=step: tqdm's rate is (n - initial) / elapsed, so the first update does not count
            # the steps run before the bar opened (that was "1115506 step/s").
            self.bar = tqdm(total=event.get("steps"), initial=step, unit="step", file=self._stream,
                             desc=f"epoch {event['epoch'] + 1}/{self._epochs}"
                                  + (f" x{event['world_size']}" if event.get("world_size") else ""),
                             leave=False, dynamic_ncols=True)
        else:
            self.bar.update(max(step - self.bar.n, 0))
        self.bar.set_postfix(loss=round(float(metrics.get("loss", float("nan"))), 4),
                              sps=int(metrics.get("samples_per_s", 0)), refresh=True)
