"""What a device's convolution chooser remembers while a process runs: one :class:`ConvChoiceMemory` per
device, the device state's entry "conv choice" (netcl.runtime.device_state).

It holds the three things the choice is made from: the cost model's profiles (the heuristic's view of the
device, netcl.ops.conv_profile), the plans made so far, measured or not (netcl.ops.conv2d_planner), and
the training-time trials (netcl.ops.conv_online). The chooser (netcl.ops.conv_chooser) forgets all of it
in one call; what was measured is also stored on disk (the tuning database) and outlives the process.

Every convolution module imports this one and it imports none of them, so the modules that fill it keep
their one direction of imports: chooser -> trials -> planner -> profiles -> this memory.
"""
from __future__ import annotations

CHOICE = "conv choice"  # the device state's entry


class ConvChoiceMemory:
    """One device's convolution choices in this process. Keyed by values (layer signatures, passes,
    dtype names), never by objects."""

    def __init__(self):
        self.profiles: dict = {}  # dtype name -> conv_cost.DeviceProfile
        # (layer signature, pass, mode, budget, strategy names, forced strategy) -> conv_plan.Plan
        self.plans: dict = {}
        self.trials = None  # conv_online's trials, made at training's first "auto" call on the device

    def close(self) -> None:
        """Called when the device's state forgets this memory: the trials stop watching launches."""
        if self.trials is not None:
            self.trials.close()


def memory(device) -> ConvChoiceMemory:
    """``device``'s convolution memory (made at its first use)."""
    return device.state.entry(CHOICE, ConvChoiceMemory)
