"""A local filesystem that refuses to move a directory, as object stores cannot (S3, GCS, ABFS).

``no_directory_moves(monkeypatch)`` routes every local path that sparktrain
resolves through :func:`sparktrain.data._fs.resolve` to it, so a commit
protocol that renames a folder fails the test.  It is a
:class:`pyarrow.fs.PyFileSystem`, not a ``LocalFileSystem``: sparktrain takes
its object-store code paths (a single PUT for the commit record, check-then-put
for a lease) on it.
"""

from __future__ import annotations

from typing import List, Tuple

import pyarrow.fs as pafs


class NoDirectoryMoves(pafs.FileSystemHandler):
    """Local files; ``move`` of a directory raises ``OSError``; file moves are recorded."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.moves: List[Tuple[str, str]] = []
        self.refused: List[Tuple[str, str]] = []

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoDirectoryMoves)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "no-directory-moves"

    def normalize_path(self, path):
        return self.fs.normalize_path(path)

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("refusing to empty the root")

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        if self.fs.get_file_info(src).type == pafs.FileType.Directory:
            self.refused.append((src, dest))
            raise OSError(f"cannot move the directory '{src}' to '{dest}': an object store has no directory rename")
        self.moves.append((src, dest))
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        return self.fs.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)


def no_directory_moves(monkeypatch) -> NoDirectoryMoves:
    """Route sparktrain's local paths through :class:`NoDirectoryMoves`; returns the handler (its ``refused`` list)."""
    from sparktrain.data import _fs

    handler = NoDirectoryMoves()
    wrapped = pafs.PyFileSystem(handler)
    real = _fs.resolve

    def resolve(path, filesystem=None):
        fs, inner = real(path, filesystem)
        return (wrapped, inner) if isinstance(fs, pafs.LocalFileSystem) else (fs, inner)

    monkeypatch.setattr(_fs, "resolve", resolve)
    return handler
