"""The calls of one dumped step: their msprobe names, their order and their tree (construct.json).

Names as msprobe writes them: a module's ``n``-th call of the step is
``Module.<path>.<Class>.forward.<n>`` and its backward ``...backward.<n>``; an API's is
``Functional.linear.<n>.forward`` and ``...backward``; a module's parameter gradients are
``...parameters_grad.<n>``. A forward call's parent is the module call it runs in.

>>> tree = CallTree()
>>> outer = tree.module_call("Module.mlp.MLP", 1)
>>> tree.api_call("Functional.linear", "api")
'Functional.linear.0.forward'
>>> tree.construct["Functional.linear.0.forward"]
'Module.mlp.MLP.forward.0'
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
        self._bwd_stack: list[str] = []
        self._module_calls: dict[int, int] = {}
        self._module_open: dict[int, list[int]] = {}
        self._module_bwd_seen: dict[int, int] = {}
        self._api_counts: dict[str, int] = {}

    def add(self, name: str, kind: str, class_name: str, parent: str | None) -> None:
        """Record node ``name`` under ``parent``; it takes the next place in the step's order."""
        self.construct[name] = parent
        self.node_info[name] = (kind, class_name, self.seq)
        self.seq += 1

    # ----------------------------------------------------------------- modules
    def module_call(self, base: str, module_key: int) -> str:
        """A call of module ``base`` starts: its name; calls until its return run inside it."""
        n = self._module_calls.get(module_key, 0)
        self._module_calls[module_key] = n + 1
        self._module_open.setdefault(module_key, []).append(n)
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

    def module_backward_starts(self, base: str, module_key: int) -> None:
        """A module's backward starts: backward calls until its end run inside it."""
        open_calls = self._module_open.get(module_key)
        n = open_calls[-1] if open_calls else self._module_bwd_seen.get(module_key, 0)
        self._bwd_stack.append(f"{base}.backward.{n}")

    def module_backward(self, base: str, module_key: int) -> str:
        """A module's backward is done: its name."""
        open_calls = self._module_open.get(module_key)
        n = open_calls.pop() if open_calls else self._module_bwd_seen.get(module_key, 0)
        self._module_bwd_seen[module_key] = n + 1
        name = f"{base}.backward.{n}"
        stack = self._bwd_stack
        if stack and stack[-1] == name:
            stack.pop()
        self.add(name, "module", base.rsplit(".", 1)[-1], stack[-1] if stack else None)
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
        stack = self._bwd_stack
        self.add(name, kind, api, stack[-1] if stack else None)
        return name, kind
