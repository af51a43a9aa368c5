"""The one way netcl times device work: warm-up, synchronized samples, rotated order, a named statistic.

Everything that times kernels (the conv planner, its calibration, the GEMM tuner, `netcl bench`) goes
through :func:`sample` (one runner) or :func:`compare` (several runners in interleaved rounds). Rules:
- warm-up runs are not timed: kernel builds, PoCL's code generation at a kernel's first launch and
  first-touch page faults of fresh buffers are not what a runner costs in steady state;
- the device queue is drained before and after each sample, so a sample is the runner's own work;
- ``calls`` > 1 times a run of back-to-back calls between two waits and divides (a training loop issues
  small products that way; one call between waits would time the driver's wake-up latency);
- several runners are timed in rounds whose order rotates, so a burst of load from another process and
  the caches one runner leaves for the next hit every runner alike;
- what is timed is what the process keeps running: timing ends the cold start's deferrals
  (netcl.runtime.first_step), whose stand-in kernels would otherwise be timed and then replaced;
- the statistic is named: "median" (the default: a burst must span half the samples to move it) or
  "min" (a device characteristic that load can only slow down: tuners use it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import first_step

STATISTICS = {"median": lambda v: float(np.median(v)), "min": lambda v: float(np.min(v)),
              "mean": lambda v: float(np.mean(v))}


@dataclass
class Timing:
    """Seconds per call of one runner: every sample and the named statistic of them."""
    samples: list = field(default_factory=list)
    statistic: str = "median"

    @property
    def seconds(self) -> float:
        return STATISTICS[self.statistic](self.samples) if self.samples else float("inf")

    @property
    def ms(self) -> float:
        return self.seconds * 1e3


def calls_per_sample(flop: float) -> int:
    """Calls to time back to back for one sample of a product: enough that a sample does ~30 MFLOP."""
    return max(1, min(64, int(3e7 // max(flop, 1.0))))


def _check_statistic(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")


def timed_call(fn, device, calls: int = 1, settle: bool = False) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn`` between two waits on ``device``'s
    queue (``settle``: one untimed call first, so the sample starts from the runner's own state)."""
    first_step.end(device)
    if settle:
        fn()
    device.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    device.synchronize()
    return (time.perf_counter() - start) / calls


def timed_result(fn, device):
    """(fn's result, seconds) of one call between two waits on ``device``'s queue (a benchmark that needs
    the output, or one that times a step whose result feeds the next)."""
    first_step.end(device)
    device.synchronize()
    start = time.perf_counter()
    out = fn()
    device.synchronize()
    return out, time.perf_counter() - start


def sample(fn, device, repeats: int = 5, warmup: int = 1, calls: int = 1, statistic: str = "median") -> Timing:
    """``repeats`` timed samples of ``fn`` after ``warmup`` untimed runs."""
    _check_statistic(statistic)
    first_step.end(device)  # before the warm-up, which then builds the kernels the samples will run
    for _ in range(warmup):
        fn()
    return Timing([timed_call(fn, device, calls) for _ in range(repeats)], statistic)


def compare(runners: dict, device, *, warmup: int = 2, min_runs: int = 7, max_runs: int = 40,
            time_budget_s: float = 3.0, contention: float = 1.3, settle_below_s: float = 0.05,
            slow_s: float = 1.0, statistic: str = "median", errors: tuple = (Exception,),
            isolate_above: float = 10.0, min_time_s: float = 0.0, time_isolated: bool = True) -> dict:
    """Time several runners against each other: {name: Timing, or the exception a runner raised}.

    The runners first take ``warmup`` untimed turns (the last one's duration sorts them), then take
    turns in timed rounds whose order rotates. A runner whose warm-up took more than ``isolate_above``
    times the fastest one's is timed in its own later rounds, ``min_runs`` samples and no more (without
    ``time_isolated``, its warm-up time is its one sample: it cannot be the fastest; one over ``slow_s``
    also gets a single warm-up run): run between the others' samples, a runner many times slower leaves
    the caches and the driver in a state that slows every sample of the fast ones. Every runner gets
    ``min_runs`` samples, except one whose single sample already exceeds ``slow_s`` and three times the
    best; runners within ``contention`` of the best get further rounds, up to ``max_runs``, while the
    timed total stays within ``time_budget_s``; all of them keep going (up to ``max_runs``) until the
    rounds span ``min_time_s``: a burst of load from another process can outlast the rounds of a few
    short runners and slow all their fastest samples. A runner faster than ``settle_below_s`` runs once
    untimed before each sample: what ran before it leaves caches that slow it.
    """
    _check_statistic(statistic)
    first_step.end(device)
    results: dict[str, object] = {}
    warm: dict[str, float] = {name: 0.0 for name in runners}
    # Warm-up in interleaved rounds too: runners warmed one after the other stay slow in every sample of
    # the first timing of a layer (PoCL's code generation, buffers, caches), and are fine in the next.
    for round_ in range(warmup):
        fastest = min((t for t in warm.values() if t > 0), default=0.0)
        for name in [n for n in runners if n in warm]:
            if round_ and warm[name] > slow_s and warm[name] > isolate_above * fastest:
                continue  # far too slow to win: one warm-up of several seconds is enough
            try:
                warm[name] = timed_call(runners[name], device)
            except errors as exc:
                results[name] = exc
                del warm[name]
    fastest = min(warm.values(), default=0.0)
    groups = [[n for n in warm if warm[n] <= isolate_above * fastest or fastest <= 0],
              [n for n in warm if fastest > 0 and warm[n] > isolate_above * fastest]]
    if not time_isolated:
        results.update({n: Timing([warm[n]], statistic) for n in groups[1]})
        groups = groups[:1]
    # An isolated runner cannot be the fastest: its ``min_runs`` samples place it, and spans or budgets
    # meant to separate close rivals only repeat it (a calibration spent 10 of its 140 s there).
    spans = [(max_runs, time_budget_s, min_time_s), (min_runs, 0.0, 0.0)]
    for group, (runs_cap, budget_s, span_s) in zip(groups, spans):
        if group:
            results.update(_rounds({n: runners[n] for n in group}, device, min_runs, runs_cap, budget_s,
                                   contention, settle_below_s, slow_s, statistic, span_s))
    return {name: results[name] for name in runners if name in results}


def _rounds(runners, device, min_runs, max_runs, time_budget_s, contention, settle_below_s, slow_s,
            statistic, min_time_s=0.0) -> dict:
    timings = {name: Timing([], statistic) for name in runners}
    spent, rounds = 0.0, 0
    started = time.perf_counter()
    while rounds < max_runs:
        best = min((t.seconds for t in timings.values() if t.samples), default=None)
        active = []
        for name, t in timings.items():
            current = t.seconds if t.samples else None
            if current is None or best is None:
                active.append(name)
            elif (rounds < min_runs or time.perf_counter() - started < min_time_s) \
                    and not (current > slow_s and current > 3 * best):
                active.append(name)
            elif current <= contention * best and spent < time_budget_s:
                active.append(name)
        if not active:
            break
        shift = rounds % len(active)
        for name in active[shift:] + active[:shift]:
            t = timings[name]
            elapsed = timed_call(runners[name], device, settle=not t.samples or t.seconds < settle_below_s)
            t.samples.append(elapsed)
            spent += elapsed
        rounds += 1
    return timings
