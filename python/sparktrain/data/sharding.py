"""Shard, shuffle and batch arithmetic: pure functions of the dataset's row counts.

Nothing here reads data, so every rank computes the same plan from the
manifest alone, and the plan of any (epoch, batch) can be computed without
replaying the epoch (which is what makes the cursor cheap to resume from).

One epoch, for ``rank`` of ``world_size``:

1. **Stream.** The row groups ("pieces") are put in an order: their natural
   order (file path, then row group) with ``shuffle=False``, else a
   permutation drawn from ``(seed, epoch)``.  Concatenated, they form the
   epoch's stream of ``N`` rows, identical on every rank.
2. **Shard.** Rank ``r`` takes the stream positions ``[r*S, (r+1)*S)``, taken
   modulo ``N``.  With ``remainder="wrap"``, ``S = ceil(N / world_size)``: the
   last shard wraps around to the start of the stream, so ``S*world_size - N``
   (< ``world_size``) rows are read twice per epoch.  With
   ``remainder="drop"``, ``S = floor(N / world_size)`` and the last
   ``N - S*world_size`` rows of the stream are skipped that epoch.  Sharding
   is by row, so any ``N >= 1`` works for any world size, whatever the number
   of row groups.
3. **Batch.** The shard is cut into ``ceil(S / batch_size)`` batches; the last
   one is partial, with the same size on every rank.  ``drop_last=True`` drops
   that partial batch instead (``floor(S / batch_size)`` batches).
4. **Row shuffle.** With ``shuffle=True`` and ``shuffle_buffer > 0`` the shard
   is cut into windows of ``W`` rows (``shuffle_buffer`` rounded up to a
   whole number of batches) and each window is permuted with a generator
   seeded by ``(seed, epoch, world_size, rank, window)``.  A batch is thus
   drawn from ``W`` rows of the row-group-shuffled stream, as with a shuffle
   buffer of that size, and batch ``k`` depends only on its own window.
"""

from __future__ import annotations

import numpy as np

REMAINDERS = ("wrap", "drop")
_WINDOW_SALT = 0x5EED


def shard_rows(num_rows: int, world_size: int, remainder: str) -> int:
    """Rows one rank's shard holds per epoch (same for every rank)."""
    if remainder == "wrap":
        return -(-num_rows // world_size)
    return num_rows // world_size


def steps_per_epoch(num_rows: int, world_size: int, batch_size: int, remainder: str, drop_last: bool) -> int:
    """Batches every rank yields per epoch."""
    s = shard_rows(num_rows, world_size, remainder)
    return s // batch_size if drop_last else -(-s // batch_size)


def window_rows(batch_size: int, shuffle_buffer: int, shuffle: bool) -> int:
    """Rows per shuffle window: ``shuffle_buffer`` rounded up to whole batches."""
    if not shuffle or shuffle_buffer <= 0:
        return batch_size
    return -(-max(shuffle_buffer, batch_size) // batch_size) * batch_size


def piece_order(num_pieces: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Order of the row groups in an epoch's stream (same on every rank)."""
    if not shuffle:
        return np.arange(num_pieces)
    return np.random.default_rng([seed, epoch]).permutation(num_pieces)


def window_permutation(n: int, seed: int, epoch: int, world_size: int, rank: int, window: int) -> np.ndarray:
    """Permutation of the ``n`` rows of one shuffle window."""
    return np.random.default_rng([seed, epoch, world_size, rank, window, _WINDOW_SALT]).permutation(n)


class EpochPlan:
    """Where the rows of one rank's shard come from in one epoch.

    Parameters
    ----------
    piece_rows : numpy.ndarray
        Rows of each piece (row group), in natural order.
    order : numpy.ndarray
        The epoch's piece order (:func:`piece_order`).
    rank, world_size : int
        This shard.
    shard_size : int
        Rows of every shard (:func:`shard_rows`).
    rows_used : int
        Rows actually yielded (``shard_size``, or fewer with ``drop_last``).
    """

    def __init__(self, piece_rows: np.ndarray, order: np.ndarray, rank: int, world_size: int,
                 shard_size: int, rows_used: int) -> None:
        self.order = np.asarray(order)
        ordered = np.asarray(piece_rows, dtype=np.int64)[self.order]
        self.ends = np.cumsum(ordered)
        self.starts = self.ends - ordered
        self.num_rows = int(self.ends[-1]) if len(self.ends) else 0
        self.offset = rank * shard_size
        self.rows_used = rows_used

    def segments(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """Pieces covering shard offsets ``[start, stop)``, in stream order.

        Returns
        -------
        list of (piece, lo, hi)
            ``piece`` indexes the natural order; rows ``[lo, hi)`` of it.
        """
        out: list[tuple[int, int, int]] = []
        n = self.num_rows
        pos = self.offset + start
        remaining = stop - start
        while remaining > 0:
            g = pos % n
            take = min(remaining, n - g)
            a, b = g, g + take
            i = int(np.searchsorted(self.ends, a, side="right"))
            while a < b:
                hi = min(b, int(self.ends[i]))
                if hi > a:
                    base = int(self.starts[i])
                    out.append((int(self.order[i]), a - base, hi - base))
                a = hi
                i += 1
            pos += take
            remaining -= take
        return out
