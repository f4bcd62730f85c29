"""The bundled engine: a small Llama-style decoder in a reference and a fused implementation.

It trains on synthetic tokens with AdamW, single-process or as N ranks under
``torch.distributed``, emits per-step metrics to the record store, and can plant faults.
"""
