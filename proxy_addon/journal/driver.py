"""What the journal's writes need of a connection (`Connection`: a statement run, several sent together), the
writer's DBAPI connection as one (`OnDriver`), and a statement sent ahead (`Sent`)."""

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...


class Connection(Protocol):
    """What the writes need of a connection: a statement run (its text in the driver's parameter style, its
    parameters as the driver takes them), and a way to send several together."""

    def execute(self, statement: str, params: dict[str, Any]) -> Cursor: ...

    def pipeline(self) -> AbstractContextManager[Any]:
        """Statements sent within it may go together (one round trip); each is still run in order."""
        ...


class OnDriver:
    """A Connection that is the DBAPI connection itself (the journal writer's)."""

    __slots__ = ("driver",)

    def __init__(self, driver: Any):
        self.driver = driver

    def execute(self, statement: str, params: dict[str, Any]) -> Cursor:
        cursor = self.driver.cursor()
        cursor.execute(statement, params)
        return cursor

    def pipeline(self) -> AbstractContextManager[Any]:
        return self.driver.pipeline()  # psycopg's pipeline mode


@dataclass(frozen=True, slots=True)
class Sent:
    """A write's first statement sent ahead by `pipelined`, and the history head it leaves if it applies."""

    cursor: Cursor
    head: str
