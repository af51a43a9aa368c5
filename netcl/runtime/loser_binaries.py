"""Keeping the programs that only a contest's losers ran out of the binary cache.

A contest (the convolution planner's training-time trials, netcl.ops.conv_online) runs several
candidates for one job and keeps the fastest. Writing a program's binary costs PoCL a second compile,
so a program that only losing candidates ever launched is not worth writing. :class:`LoserBinaries`
watches one device's launches while any contest is open and, when one finishes, forgets
(netcl.runtime.binaries.forget) the programs whose launchers all lost.
"""
from __future__ import annotations

from . import binaries
from .observers import launch_watcher


class LoserBinaries:
    """A program first built from source while a candidate ran is a suspect. While any contest is open,
    every launch is noted with who made it: a candidate of a contest, or anything else (OTHER). A suspect
    whose launchers all lost finished contests is forgotten; one that a winner or anything else launched
    is kept. A contest is any object whose ``lost(name)`` says whether candidate ``name`` lost it (None
    while it is open). A contest that never finishes (training stopped early) leaves the watching on, at
    the cost of a set insertion per launch. One per device: it watches that device's launches.
    """
    OTHER = "other"

    def __init__(self, state):
        self.state = state  # the device's (netcl.runtime.device_state), whose launches are watched
        self.open_contests = 0
        self.launcher = self.OTHER  # (contest, name) while a candidate runs
        self.launchers: dict = {}  # kernel -> {launcher keys}, while any contest is open
        self.suspects: dict = {}  # binary path -> program handle
        self.watcher = None

    def opened(self) -> None:
        self.open_contests += 1
        if self.watcher is None:
            self.watcher = launch_watcher(self._note)
            self.state.push(self.watcher)

    def _note(self, kernel) -> None:
        launchers = self.launchers.get(kernel)
        if launchers is None:
            launchers = self.launchers[kernel] = set()
        launchers.add(self.launcher)

    def run(self, contest, name: str, execute):
        """``execute(name)`` as candidate ``name`` of ``contest``: what it builds is suspect, its launches
        its own."""
        self.launcher = (contest, name)
        try:
            with binaries.builds_inside() as built:
                return execute(name)
        finally:
            self.launcher = self.OTHER
            self.suspects.update((path, program.int_ptr) for path, program in built.items())

    def finished(self) -> int:
        """Forget the suspects that only losers ran; returns how many. The last open contest ends the
        watching."""
        self.open_contests -= 1
        by_program: dict = {}
        for kernel, launchers in self.launchers.items():
            by_program.setdefault(kernel.program.int_ptr, set()).update(launchers)
        forgotten = []
        for path, handle in list(self.suspects.items()):
            # per launcher: True lost, False won or is another op, None its contest is still open
            verdicts = [False if key == self.OTHER else key[0].lost(key[1])
                        for key in by_program.get(handle, ())]
            if False in verdicts:
                del self.suspects[path]  # a winner or another op runs it: its binary is worth writing
            elif verdicts and all(verdicts):
                del self.suspects[path]
                forgotten.append(path)
        if self.open_contests <= 0:
            self.reset()
        return binaries.forget(forgotten)

    def reset(self) -> None:
        if self.watcher is not None:
            self.state.remove(self.watcher)
            self.watcher = None
        self.open_contests = 0
        self.launcher = self.OTHER
        self.launchers.clear()
        self.suspects.clear()
