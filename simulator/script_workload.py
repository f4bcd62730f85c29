"""Trace a user's training script, unchanged, on fake tensors.

The script runs in this process (the caller supplies ``run``, e.g. ``probe.script.run_script``)
inside :class:`~probe.simulator.fake_run.FakeRun`: every tensor it makes is fake, its value reads get
placeholders (:mod:`probe.simulator.placeholders`, each noted with its line), and it stops after
``max_steps`` optimizer steps. With ``--nproc N`` it runs as rank 0 of ``N`` data-parallel ranks
(``torch.distributed`` answers through a ``fake`` process group); its gradient sync is taken
to overlap backward as DDP's does. The timed step is the second one when there is one
(optimizer state exists by then).

>>> import os, tempfile
>>> from probe.simulator.layout import make_layout
>>> path = os.path.join(tempfile.mkdtemp(), "train.py")
>>> _ = open(path, "w").write(
...     "import torch\\nm = torch.nn.Linear(64, 64)\\nopt = torch.optim.AdamW(m.parameters())\\n"
...     "while True:\\n    loss = m(torch.randn(8, 64)).pow(2).mean()\\n    loss.backward()\\n"
...     "    opt.step(); opt.zero_grad()\\n    print(f'loss {loss.item():.3f}')\\n")
>>> import runpy
>>> traced, code = trace_script(lambda: runpy.run_path(path) and 0, path, max_steps=2,
...                             layout=make_layout(nproc=1, global_batch=1))
loss 1.000
>>> traced.params, traced.ranks[0].timed_step, code
(4160, 1, 0)
"""

from __future__ import annotations

from typing import Callable

from probe.simulator.fake_run import FakeRun
from probe.simulator.layout import Layout
from probe.simulator.workload import RankTrace, Traced


def trace_script(run: Callable[[], int], script: str, *, max_steps: int, layout: Layout,
                 signatures: bool = False) -> tuple[Traced, int]:
    """Trace ``run()`` (the script's execution); the traced rank and ``run``'s exit code."""
    code = 0
    with FakeRun(max_steps=max_steps, world_size=layout.dp, script=script,
                 signatures=signatures) as fake:
        code = run()
    trace = fake.tracer.trace
    notes = [str(note) for note in fake.reader.notes()]
    if fake.steps == 0:
        notes.append("the script finished no optimizer step: the figures cover what it ran")
    elif not fake.stopped:
        notes.append(f"the script ended after {fake.steps} optimizer step(s)")
    rank = RankTrace(label="every rank", ranks=list(range(layout.nproc)), trace=trace,
                     timed_step=1 if fake.steps >= 2 else 0, dp_sync="overlapped")
    dtypes = [d for d, f in zip(trace.op_dtype, trace.op_flops) if f]
    dtype = max(set(dtypes), key=dtypes.count) if dtypes else "float32"
    describe = {"workload": "script", "script": script, "steps_traced": fake.steps,
                "placeholders": len(fake.reader.notes())}
    return Traced([rank], trace.params, dtype, describe, notes), code
