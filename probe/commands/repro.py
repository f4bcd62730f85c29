"""``probe repro COMPARE_DIR [--node NAME] --out DIR``: one divergence of a compare as a folder
that runs anywhere with torch and safetensors (``python DIR/run.py``).

Exit codes: 0 written; 2 bad input (one line naming the file or the node); 3 internal error.
"""

from __future__ import annotations

import click


@click.command("repro", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("compare_dir", type=click.Path())
@click.option("--node", default=None, metavar="NAME",
              help="The node to reproduce, by A's or B's name (a forward module or API call) "
                   "[default: the compare's first divergence].")
@click.option("--out", "out_dir", type=click.Path(), required=True,
              help="Folder for run.py, repro.json, README.md and the sides' a/ and b/.")
@click.option("--force", is_flag=True, default=False,
              help="Replace entries of --out that probe repro did not write.")
def command(compare_dir: str, node: str | None, out_dir: str, force: bool) -> int:
    """Write a standalone reproducer of a divergence found by ``probe compare``.

    COMPARE_DIR: the --out folder of probe compare. The folder written holds the node's inputs,
    parameters and outputs on both sides (safetensors: from the tensor dump, or from a
    targeted re-run of that step when the runs were dumped with statistics only), the code
    that builds the module on each side, and run.py, which needs only torch and safetensors:
    it runs A's and B's module on their inputs, prints the compare's metrics and exits 1 when
    the divergence reproduces (0 when not); --json prints them as JSON; --swap-inputs runs
    each module on the other side's inputs and says whether the module or its inputs diverge.

    \b
    Example (a weight planted 1.5x too large in B; tensor dumps, so nothing is re-run):
        probe dump --level module --task tensor --steps 0 --max-steps 1 --out runs/rp-a
        probe dump --level module --task tensor --steps 0 --max-steps 1 --fault scale:layers.1.mlp.down_proj.weight:1.5 --out runs/rp-b
        probe compare runs/rp-a/step0/rank0/dump.json runs/rp-b/step0/rank0/dump.json --out runs/rp-cmp
        probe repro runs/rp-cmp --out runs/repro
        probe repro runs/rp-cmp --node Module.norm.RMSNorm.forward.0 --out runs/repro-norm
        python runs/repro/run.py --swap-inputs     (prints: the module diverges)
    \b
    Exit codes: 0 written; 2 bad input (no compare there, a node it does not have, a dump
    without tensors and no way to re-run it); 3 internal error.
    """
    from probe.checker.repro import make_repro

    r = make_repro(compare_dir, out_dir, node, force=force)
    click.echo(f"node ({r.kind}): A {r.node_a}")
    click.echo(f"              B {r.node_b}")
    if r.expected["max_abs_error"] is None:
        click.echo(f"compare said: {r.expected['verdict']} ({r.expected['reason'] or 'agrees'}; statistics "
                   "only: no element-wise metrics)")
    else:
        click.echo(f"compare said: {r.expected['verdict']} (max abs error {r.expected['max_abs_error']:.6e}, "
                   f"max rel error {r.expected['max_rel_error']:.6e}, cosine {r.expected['cosine']:.12f})")
    for side in ("a", "b"):
        click.echo(f"{side.upper()}: tensors from {r.sources[side]}")
        click.echo(f"   module from {'; or '.join(r.routes[side])}")
    for note in r.notes:
        click.echo(note)
    click.echo(f"wrote {r.out}/run.py, repro.json, README.md, a/, b/ — run: python {r.out}/run.py [--json | --swap-inputs]")
    return 0
