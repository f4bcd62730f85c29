"""The names of per-module numerics metric points: ``numerics:<module path>:<quantity>``.

The numerics callback (:mod:`probe.monitor.agent.numerics_callback`) sends, for each watched module and
step, one point per quantity; the service stores them as any metric point, and everything that
reads them back (the detectors, charts, exports) splits the name with :func:`parse_metric_name`.
A module path never holds ``:`` in PyTorch (it is dotted), so the last ``:`` ends it.

- ``activation_norm``: L2 norm of the module's output (all its calls in the step);
- ``weight_norm``: L2 norm of its parameters after the optimizer step;
- ``grad_norm``: L2 norm of its parameters' gradients (after the all-reduce);
- ``update_ratio``: ``||w_after - w_before|| / ||w_after||`` across the optimizer step;
- ``optimizer_state_norm``: L2 norm of its parameters' optimizer state tensors together (Adam:
  ``exp_avg`` and ``exp_avg_sq``);
- ``nonfinite``: NaN and Inf values counted in its output, parameters and gradients.

>>> metric_name("layers.0.mlp.down_proj", "grad_norm")
'numerics:layers.0.mlp.down_proj:grad_norm'
>>> parse_metric_name("numerics:layers.0.mlp.down_proj:grad_norm")
('layers.0.mlp.down_proj', 'grad_norm')
>>> parse_metric_name("loss") is None, parse_metric_name("numerics:x:speed") is None
(True, True)
"""

from __future__ import annotations

#: The prefix of every numerics metric name.
PREFIX = "numerics:"
#: The quantities, in the order the callback sends them.
QUANTITIES = ("activation_norm", "weight_norm", "grad_norm", "update_ratio",
              "optimizer_state_norm", "nonfinite")
_QUANTITY_SET = frozenset(QUANTITIES)


def metric_name(module: str, quantity: str) -> str:
    """``numerics:<module>:<quantity>``; a ValueError for a quantity not in :data:`QUANTITIES`."""
    if quantity not in _QUANTITY_SET:
        raise ValueError(f"numerics quantity {quantity!r}: use one of {', '.join(QUANTITIES)}")
    return f"{PREFIX}{module}:{quantity}"


def parse_metric_name(name: str) -> tuple[str, str] | None:
    """``(module, quantity)`` of a numerics metric name, None for any other name."""
    if not name.startswith(PREFIX):
        return None
    module, sep, quantity = name[len(PREFIX):].rpartition(":")
    if not sep or not module or quantity not in _QUANTITY_SET:
        return None
    return module, quantity
