"""Replays the shortest call sequence found to crash torch_aoti:BACKEND in
conformance/test_differential.py::test_protocol_calls_agree_with_the_oracle[cpu-shard2]
(rule differential/missing-error). Run it from the suite's checkout: python results/crashes/test_differential.py_test_protocol_calls_agree_with_the_oracle_cpu-shard2.py"""

import os
import sys

sys.path[:0] = [os.getcwd(), '/tmp/fresh']

from conformance.crash_replay import replay, unpickled  # noqa: E402, F401
from conformance.protocol_plans import CorruptPlan, InputsPlan, LowerPlan, OutputsPlan  # noqa: E402, F401
from conformance.strategies import MmOutPlan  # noqa: E402, F401

MACHINE = {'backend': 'torch_aoti:BACKEND', 'backend_path': [], 'oracle': 'reference_impl:ORACLE', 'device': 'cpu', 'shard': 1, 'run_seed': None, 'lowerable': ['add_mul', 'asr', 'llm'], 'case': 'conformance/test_differential.py::test_protocol_calls_agree_with_the_oracle[cpu-shard2]'}
STEPS = [
    ('start', {'model': 'add_mul', 'which': 0}),
    ('execute', {'broken': (InputsPlan(seed=1, layouts=('contiguous',), size='min', bad='empty-size', bad_index=0, on_device=True), OutputsPlan(kind='none')), 'index': 1}),
]

if __name__ == "__main__":
    replay(MACHINE, STEPS)
    print("the sequence ran to its end without a crash")
