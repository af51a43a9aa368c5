"""netcl.runtime.loser_binaries: the programs only a contest's losers ran are not written to the cache."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

from netcl.runtime import binaries, loser_binaries
from netcl.runtime.device_state import DeviceState


class Kernel:
    """Hashable as a cl.Kernel is; its program has the handle a built program has."""

    def __init__(self, program):
        self.program = program


class Contest:
    def __init__(self):
        self.winner = None

    def lost(self, name):
        return None if self.winner is None else self.winner != name


def test_only_programs_that_losers_alone_launched_are_forgotten(monkeypatch):
    state = DeviceState()
    programs = {name: SimpleNamespace(int_ptr=handle) for handle, name in enumerate(("a", "b", "both", "op"), 1)}
    kernels = {name: Kernel(program) for name, program in programs.items()}
    building: dict = {}
    forgotten = []

    @contextlib.contextmanager
    def builds_inside():
        built = {}
        yield built
        built.update(building)
        building.clear()
    monkeypatch.setattr(binaries, "builds_inside", builds_inside)
    monkeypatch.setattr(binaries, "forget", lambda paths: forgotten.extend(paths) or len(paths))

    def launch(name):
        for observer in state.observers:
            observer.kernel(None, kernels[name], (1,), None, ())

    def candidate(*names):
        def execute(_):
            for name in names:
                building.setdefault(f"{name}.bin", programs[name])
                launch(name)
            return names
        return execute
    losers = loser_binaries.LoserBinaries(state)
    contest = Contest()
    losers.opened()
    assert len(state.observers) == 1
    assert losers.run(contest, "a", candidate("a", "both")) == ("a", "both")
    assert losers.run(contest, "b", candidate("b", "both")) == ("b", "both")
    building["op.bin"] = programs["op"]
    losers.run(contest, "b", candidate())  # builds nothing itself: op.bin is not its
    launch("op")  # another operation's launch, outside any candidate
    contest.winner = "b"
    assert losers.finished() == 1
    assert forgotten == ["a.bin"]  # "both" was launched by the winner too; "op" by another op
    assert state.observers == () and not losers.launchers and not losers.suspects


def test_an_open_contest_keeps_the_watching_on():
    state = DeviceState()
    losers = loser_binaries.LoserBinaries(state)
    losers.opened()
    losers.opened()
    assert losers.finished() == 0 and len(state.observers) == 1
    assert losers.finished() == 0 and state.observers == ()
