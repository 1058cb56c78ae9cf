"""What /proc says of this machine's processes: a process's state and parent, and the processes it started."""

import os
from pathlib import Path


def process_state(pid: int) -> tuple[str, int] | None:
    """The process's state letter (`Z`: a zombie waiting to be reaped) and its parent's pid; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    children: dict[int, list[int]] = {}
    for child in pids():
        if (state := process_state(child)) is not None:
            children.setdefault(state[1], []).append(child)
    tree, todo = [], [pid]
    while todo:
        tree.append(current := todo.pop())
        todo.extend(children.get(current, []))
    return tree
