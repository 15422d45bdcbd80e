"""The one way pyq2 reads metadata: a file's key/values (pyq2.gguf.io.GGUFFile) or a dict of
them (Keys), through `value(key, default)`, `has(key)` and `path` (what messages name)."""

from __future__ import annotations

from typing import Any, Protocol


class KeyValues(Protocol):
    path: str

    def has(self, key: str) -> bool: ...

    def value(self, key: str, default: Any = None) -> Any: ...


class Keys(dict):
    """Metadata held in a dict, read as a file's are; `path` names it in messages."""

    def __init__(self, items: Any = (), path: str = "metadata"):
        super().__init__(items)
        self.path = path

    def has(self, key: str) -> bool:
        return key in self

    def value(self, key: str, default: Any = None) -> Any:
        return self.get(key, default)
