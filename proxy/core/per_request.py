"""`per_request`: the dataclass of a value made on every request's path (what an exchange
read, asked, prepared and sent; the usage its answer reported).

Frozen to the type checker, which refuses any assignment to a field as it does a frozen
dataclass's (new values are made with `dataclasses.replace`), and a plain slotted
dataclass at run time: a frozen dataclass's generated `__init__` sets each field through
`object.__setattr__`, 1.8 µs against 0.35 µs for eight fields in process, and the five an
exchange makes were some 3% of a pass-through request's CPU (bench/RESULTS.md, issue 34).
Unlike a frozen dataclass it is not hashable; nothing hashes these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def per_request(cls: type[T]) -> type[T]:
    return dataclass(slots=True)(cls)
