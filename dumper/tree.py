"""The calls of one dumped step: their msprobe names, their order and their tree (construct.json).

Names as msprobe writes them: a module's ``n``-th call of the step is
``Module.<path>.<Class>.forward.<n>`` and its backward ``...backward.<n>``; an API's is
``Functional.linear.<n>.forward`` and ``...backward``; a module's parameter gradients are
``...parameters_grad.<n>``.

The tree:

1. A forward call's parent is the module call it runs in (the innermost one not yet returned).
2. A backward node mirrors one forward call (the adapter says which, by its name) and its parent
   is the backward node of that forward call's parent, the same call index: the tree of the
   backward mirrors the forward one, whatever order backward runs in.
3. When that parent has no backward node (no gradient reached it, or the filters left it
   out), the nearest forward ancestor that has one is the parent; None when none has.
   Parents are given when the step ends (:meth:`CallTree.finish`): a backward node is recorded
   before the backward of its parent.

Every parent is thus a node of the same direction higher up the forward tree: the tree is a
forest, also for a module called twice, reused in a loop, or run again by activation
checkpointing.

>>> tree = CallTree()
>>> mlp = tree.module_call("Module.mlp.MLP", 1)
>>> linear = tree.api_call("Functional.linear", "api")
>>> tree.module_return(mlp)
>>> tree.api_backward(linear), tree.module_backward(mlp, 1)
(('Functional.linear.0.backward', 'api'), 'Module.mlp.MLP.backward.0')
>>> tree.finish()
>>> tree.construct["Functional.linear.0.backward"]
'Module.mlp.MLP.backward.0'
"""

from __future__ import annotations

from typing import Container


class CallTree:
    """Names the calls of one step and keeps their parents, kind, class and order."""

    def __init__(self) -> None:
        self.construct: dict[str, str | None] = {}
        self.node_info: dict[str, tuple[str, str, int]] = {}   # name -> (kind, class, order)
        self.seq = 0
        self._fwd_stack: list[str] = []
        self._module_calls: dict[int, int] = {}
        self._api_counts: dict[str, int] = {}
        self._mirrors: dict[str, str] = {}    # backward node -> the forward call it mirrors

    def add(self, name: str, kind: str, class_name: str, parent: str | None) -> None:
        """Record node ``name`` under ``parent``; it takes the next place in the step's order."""
        self.construct[name] = parent
        self.node_info[name] = (kind, class_name, self.seq)
        self.seq += 1

    def finish(self) -> None:
        """Give every backward node its parent (rules 2 and 3 of the module docstring)."""
        construct = self.construct
        for name, forward in self._mirrors.items():
            parent = construct.get(forward)
            while parent is not None:
                base, _, n = parent.rsplit(".", 2)          # a module call: X.forward.<n>
                backward = f"{base}.backward.{n}"
                if backward in construct:
                    parent = backward
                    break
                parent = construct.get(parent)
            construct[name] = parent

    # ----------------------------------------------------------------- modules
    def module_call(self, base: str, module_key: int) -> str:
        """A call of module ``base`` starts: its name; calls until its return run inside it."""
        n = self._module_calls.get(module_key, 0)
        self._module_calls[module_key] = n + 1
        name = f"{base}.forward.{n}"
        stack = self._fwd_stack
        self.add(name, "module", base.rsplit(".", 1)[-1], stack[-1] if stack else None)
        stack.append(name)
        return name

    def module_return(self, name: str) -> None:
        """The module call ``name`` returned."""
        stack = self._fwd_stack
        if stack and stack[-1] == name:
            stack.pop()
        elif name in stack:
            stack.remove(name)

    def module_backward(self, forward: str, module_key: int) -> str:
        """The backward of the module call ``forward`` is done: its name (the call's index; a
        second backward of the same call, through a retained graph, takes a new index)."""
        base, _, n = forward.rsplit(".", 2)
        name = f"{base}.backward.{n}"
        if name in self.node_info:
            k = self._module_calls.get(module_key, 0)
            self._module_calls[module_key] = k + 1
            name = f"{base}.backward.{k}"
        self._mirrors[name] = forward
        self.add(name, "module", base.rsplit(".", 1)[-1], None)
        return name

    def parameter_grads(self, base: str, taken: Container[str]) -> str:
        """The name of module ``base``'s next parameter gradients (not one of ``taken``)."""
        n = 0
        while f"{base}.parameters_grad.{n}" in taken:
            n += 1
        name = f"{base}.parameters_grad.{n}"
        self.node_info[name] = ("module", base.rsplit(".", 1)[-1], self.seq)
        self.seq += 1
        return name

    # ----------------------------------------------------------------- APIs
    def api_call(self, api: str, kind: str) -> str:
        """A call of ``api`` (kind ``api`` or ``comm``) starts: its name."""
        n = self._api_counts.get(api, 0)
        self._api_counts[api] = n + 1
        name = f"{api}.{n}.forward"
        stack = self._fwd_stack
        self.add(name, kind, api, stack[-1] if stack else None)
        return name

    def api_backward(self, forward: str) -> tuple[str, str]:
        """The backward of the API call ``forward``: its name and kind."""
        name = forward[: -len("forward")] + "backward"
        kind, api, _ = self.node_info.get(forward, ("api", forward, 0))
        self._mirrors[name] = forward
        self.add(name, kind, api, None)
        return name, kind


def node_depths(construct: dict[str, str | None]) -> dict[str, int]:
    """Each node's depth in the forest ``construct`` (a root is 0), whatever order it lists them in.

    >>> node_depths({"a.backward.0": "m.backward.0", "m.backward.0": None})["a.backward.0"]
    1
    """
    depth: dict[str, int] = {}
    for name in construct:
        chain = []
        node: str | None = name
        while node is not None and node not in depth:
            chain.append(node)
            node = construct.get(node)
        d = -1 if node is None else depth[node]
        for step in reversed(chain):
            d += 1
            depth[step] = d
    return depth
