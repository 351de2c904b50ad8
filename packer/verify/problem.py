"""The one thing every check of ``packer verify`` returns: a :class:`Problem` naming the file (and row) and what is
wrong. Its own module so the file, row and deep checks share it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    file: str
    row: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.file}{'' if self.row is None else f' row {self.row}'}: {self.message}"
