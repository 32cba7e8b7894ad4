"""A full disk, simulated: a pyarrow filesystem whose writes raise ``ENOSPC`` once ``room`` bytes are used.

No tmpfs can be mounted on the test machines, so the fault is raised where a
full disk raises it: from the output stream's ``write``.  Used by
tests/data/test_run_store.py and bench/faults.py.
"""

from __future__ import annotations

import errno
from typing import Any


class FullDisk:
    """Wraps a pyarrow filesystem (every other method is the wrapped one's); ``room``: bytes left."""

    def __init__(self, fs: Any, room: int) -> None:
        self._fs, self.room = fs, room

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def open_output_stream(self, path: str, *args: Any, **kwargs: Any) -> "_FillingStream":
        return _FillingStream(self._fs.open_output_stream(path, *args, **kwargs), self)


class _FillingStream:
    def __init__(self, out: Any, disk: FullDisk) -> None:
        self.out, self.disk = out, disk

    def write(self, data: Any) -> int:
        if len(data) > self.disk.room:
            self.out.write(bytes(data[:self.disk.room]))
            self.disk.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.disk.room -= len(data)
        return self.out.write(data)

    def close(self) -> None:
        self.out.close()

    def __enter__(self) -> "_FillingStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
