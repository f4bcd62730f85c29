"""The zoo: real training setups nobody here wrote, each dumped at module and at mix level.

Hugging Face Llama, GPT-2 (tied weights), BERT, T5 and Mixtral (mixture of experts) built from
small configs with random weights, and plain modules returning a dict and a dataclass with a
keyword-only input; Llama also with gradient accumulation, activation checkpointing (reentrant
and not), autocast bf16, a frozen base with a LoRA adapter, and ``torch.compile``. For each:

- no crash, and the losses and final weights bit-identical to the same run without the dump;
- a forward entry for every module that runs, a backward entry for every module whose output
  takes part in the backward, and backward parents that mirror the forward ones;
- the recorded statistics equal to the test's own hooks;
- a weight scaled before training named by ``probe.compare`` as where the runs first diverge.

Run by ``scripts/test.sh`` as its own stage (``pytest -m zoo``); needs transformers and peft
(the ``zoo`` extra), skipped without them.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402

from tests.zoo.harness import SETUPS, Run, entries, train  # noqa: E402
from tests.zoo.models import MODELS  # noqa: E402

pytestmark = pytest.mark.zoo

#: The weight each model has scaled for the planted fault (its module must be named).
FAULTS = {
    "llama": "model.layers.1.mlp.down_proj.weight",
    "gpt2": "transformer.h.1.mlp.c_proj.weight",
    "bert": "bert.encoder.layer.1.output.dense.weight",
    "t5": "encoder.block.1.layer.1.DenseReluDense.wo.weight",
    "moe": "model.layers.1.self_attn.o_proj.weight",
    "outputs": "body.proj.weight",
}
#: What a dump of a compiled model cannot give yet: hooks stay out of what Dynamo traces (graph
#: breaks at module boundaries changed the weights of a compiled Llama), so calls inside the
#: compiled graph have no entries; the training stays bit-identical and every parameter's
#: gradient is recorded (docs/dump.md).
COMPILED = ("torch.compile: module calls inside the compiled graph are not recorded (bit-identical "
            "training first); only parameter gradients locate a fault")
CASES = [(m, "plain") for m in MODELS] + [("llama", s) for s in SETUPS if s != "plain"]
LEVELS = ("module", "mix")


@functools.lru_cache(maxsize=None)
def baseline(name: str, setup: str) -> Run:
    return train(name, setup)


def _entry(path: str, cls: str, direction: str) -> str:
    return f"Module.{path}.{cls}.{direction}.0"


@pytest.fixture(params=CASES, ids=[f"{m}-{s}" for m, s in CASES])
def case(request):
    return request.param


@pytest.mark.parametrize("level", LEVELS)
def test_the_dump_changes_nothing_and_records_every_module(case, level, tmp_path):
    name, setup = case
    base = baseline(name, setup)
    run = train(name, setup, dump={"out": str(tmp_path / "a"), "level": level})
    assert run.losses == base.losses, "the losses moved under the dump"
    moved = [k for k in base.weights if not torch.equal(base.weights[k], run.weights[k])]
    assert not moved, f"weights moved under the dump: {moved[:5]}"

    data, construct = entries(tmp_path / "a")
    if setup == "compile":
        grads = {k for k in data if ".parameters_grad." in k}
        assert grads, "no parameter gradient recorded under torch.compile"
        pytest.xfail(COMPILED)
    missing_fwd = [p for p, s in base.seen.items() if _entry(p, s.cls, "forward") not in data]
    assert not missing_fwd, f"modules with no forward entry: {missing_fwd[:8]}"
    missing_bwd = [p for p, s in base.seen.items()
                   if s.requires_grad and _entry(p, s.cls, "backward") not in data]
    assert not missing_bwd, f"modules in the backward with no backward entry: {missing_bwd[:8]}"

    unmirrored = []
    for b in (k for k in data if ".backward." in k and k.startswith("Module.")):
        f = b.replace(".backward.", ".forward.")
        if f in construct:
            pf = construct[f]
            want = pf.replace(".forward.", ".backward.") if pf else pf
            if construct.get(b) != want:
                unmirrored.append(f"{b}: parent {construct.get(b)}, forward's {pf}")
    assert not unmirrored, "backward parents that do not mirror the forward:\n" + "\n".join(unmirrored[:8])

    differ = []
    for p, s in base.seen.items():
        entry = data.get(_entry(p, s.cls, "forward"))
        if s.stats is None or entry is None or not entry.get("output"):
            continue
        got = entry["output"][0]
        if not isinstance(got, dict) or got.get("Max") is None:
            continue
        rec = (got["Max"], got["Min"], got["Mean"], got["Norm"])
        if rec != pytest.approx(s.stats, rel=1e-5, abs=1e-6):
            differ.append(f"{p}: dump {rec} vs hooks {s.stats}")
    assert not differ, "statistics unlike the test's own hooks:\n" + "\n".join(differ[:8])


@pytest.mark.parametrize("level", LEVELS)
def test_a_planted_weight_fault_is_named_as_the_first_divergence(case, level, tmp_path):
    import probe

    name, setup = case
    if setup == "compile":
        pytest.xfail(COMPILED)
    weight = FAULTS[name]
    train(name, setup, steps=1, dump={"out": str(tmp_path / "a"), "level": level})
    train(name, setup, steps=1, dump={"out": str(tmp_path / "b"), "level": level}, fault=(weight, 1.5))
    result = probe.compare(str(tmp_path / "a" / "step0" / "rank0" / "dump.json"),
                           str(tmp_path / "b" / "step0" / "rank0" / "dump.json"))
    first = result.summary["first_divergence"]
    module = weight.rsplit(".", 1)[0]
    assert first is not None, "no divergence found"
    _, construct = entries(tmp_path / "b")
    node, chain = first["b"], []
    while node:
        chain.append(node)
        node = construct.get(node)
    assert any(f".{module}." in f".{n.split('.', 1)[1]}" for n in chain), (first, chain)
