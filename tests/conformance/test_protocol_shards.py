"""The differential chapter's state machine runs in shards (``conformance.common.protocol_machine.as_shard``):
each shard must draw examples of its own, the same ones on every run, and shard 0 those of the unsharded
machine. Checked with Hypothesis itself on a machine that records what it drew, since the shards rest on
how Hypothesis seeds a run (from the machine's name, or from the run's seed)."""

from __future__ import annotations

from typing import ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from conformance.common.protocol_machine import as_shard

DERANDOMIZED = settings(derandomize=True, database=None, max_examples=8, stateful_step_count=4, deadline=None)
SEEDED = settings(DERANDOMIZED, derandomize=False)


class _Drawing(RuleBasedStateMachine):
    """Notes every value it draws, in the class the run was made from (a shard is a subclass)."""

    drawn: ClassVar[list[int]] = []

    @rule(value=st.integers(0, 2**32))
    def draw(self, value: int) -> None:
        type(self).drawn.append(value)


def _machine() -> type[_Drawing]:
    """What ``machine_for`` makes: a class built at run time, named for its target."""
    return type("ProtocolMachine_cpu", (_Drawing,), {})


def _drawn(machine: type[_Drawing], how: settings) -> list[int]:
    machine.drawn = []
    run_state_machine_as_test(machine, settings=how)
    return machine.drawn


def test_shard_zero_is_the_unsharded_machine() -> None:
    machine = _machine()
    assert as_shard(machine, 0) is machine
    assert as_shard(machine, 0, run_seed=7) is machine


def test_each_shard_draws_its_own_examples_the_same_on_every_run() -> None:
    first = [_drawn(as_shard(_machine(), k), DERANDOMIZED) for k in range(3)]
    again = [_drawn(as_shard(_machine(), k), DERANDOMIZED) for k in range(3)]
    assert first == again  # derandomized: a CI run's verdict does not change between runs
    assert all(first)
    assert len({tuple(d) for d in first}) == 3
    assert as_shard(_machine(), 2).__name__ == "ProtocolMachine_cpu_shard3"


def test_under_a_run_seed_the_shards_still_differ_and_replay() -> None:
    first = [_drawn(as_shard(_machine(), k, run_seed=1234), SEEDED) for k in (1, 2)]
    again = [_drawn(as_shard(_machine(), k, run_seed=1234), SEEDED) for k in (1, 2)]
    other = _drawn(as_shard(_machine(), 1, run_seed=99), SEEDED)
    assert first == again  # the repro line's seed finds the same examples
    assert first[0] != first[1]
    assert other != first[0]  # another seed, other examples
