"""Checksums of tensors computed where the tensors live: equal bits, equal checksum, any device.

A checksum is two sums over the tensor's raw bits, viewed as 32-bit integers ``b[i]``
(a 64-bit element is two of them; a 16- or 8-bit element is widened to one):

1. each word is mixed, ``h = b ^ (b >> 15)``, then multiplied (wrapping, 32 bits) by two
   fixed tables of odd pseudo-random words ``t1[j]``, ``t2[j]`` (``j`` the position within a
   chunk of :data:`CHUNK` words; the tables come from an integer mixer, the same on every
   device and torch version) and summed in 64 bits;
2. each chunk's two sums are multiplied by odd 64-bit words of the chunk's index and added
   (wrapping modulo 2**64), so moving data between chunks changes the result too;
3. integer sums do not depend on the order of the reduction, so a GPU and a CPU, or two runs,
   give the same checksum for the same bits; what crosses to the host is two integers per
   tensor, fetched for many tensors at once by :func:`to_hex`.

The ops are aten operators called directly, so the dump's API-level interception (which wraps
``torch.*`` and ``Tensor`` methods) does not record them.

>>> import torch
>>> sums = Checksummer()
>>> a = torch.arange(6.0)
>>> to_hex([sums(a)]) == to_hex([sums(a.clone())])
True
>>> to_hex([sums(a)]) == to_hex([sums(a.flip(0))])
False
"""

from __future__ import annotations

from typing import Sequence

import torch

aten = torch.ops.aten

#: 32-bit words per chunk: the tables and work buffers take 4 x 8 MiB per device
CHUNK = 1 << 21

_MASK64 = (1 << 64) - 1


def _signed(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def _splitmix(x: int) -> int:
    """splitmix64 of ``x`` (host integers, for the chunk multipliers)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class Checksummer:
    """Computes :func:`device checksums <to_hex>` of tensors; holds its tables per device."""

    def __init__(self) -> None:
        self._tables: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor | None:
        """An int64 tensor ``[s1, s2]`` on ``t``'s device; None for a tensor without data (meta,
        fake) or of an element size other than 1, 2, 4 or 8 bytes."""
        if t.device.type == "meta" or _is_fake(t) or t.element_size() not in (1, 2, 4, 8):
            return None
        with torch.no_grad():
            flat = aten.reshape.default(aten.detach.default(t), [-1])
            if t.element_size() == 4:
                words = aten.view.dtype(flat, torch.int32)
            elif t.element_size() == 8:
                words = aten.reshape.default(aten.view.dtype(flat, torch.int64), [-1])
                words = aten.view.dtype(aten.clone.default(words) if not _dense(words) else words,
                                        torch.int32)
            else:
                words = aten.view.dtype(flat, torch.int8 if t.element_size() == 1 else torch.int16)
            n = words.shape[0]
            t1, t2, mixed, product = self._tables_for(t.device, n)
            total = aten.zeros.default([2], dtype=torch.int64, device=t.device)
            for chunk, start in enumerate(range(0, n, CHUNK)):
                size = min(CHUNK, n - start)
                b = aten.slice.Tensor(words, 0, start, start + size)
                if b.dtype != torch.int32:
                    b = aten._to_copy.default(b, dtype=torch.int32)
                h = aten.slice.Tensor(mixed, 0, 0, size)
                p = aten.slice.Tensor(product, 0, 0, size)
                aten.bitwise_right_shift.Tensor_Scalar_out(b, 15, out=h)
                aten.bitwise_xor.Tensor_out(b, h, out=h)
                aten.mul.out(h, aten.slice.Tensor(t1, 0, 0, size), out=p)
                s1 = aten.sum.default(p, dtype=torch.int64)
                aten.mul.out(h, aten.slice.Tensor(t2, 0, 0, size), out=p)
                s2 = aten.sum.default(p, dtype=torch.int64)
                u1 = _signed(_splitmix(2 * chunk) | 1)
                u2 = _signed(_splitmix(2 * chunk + 1) | 1)
                total = aten.add.Tensor(total, aten.stack.default([aten.mul.Scalar(s1, u1),
                                                                   aten.mul.Scalar(s2, u2)]))
        return total

    def _tables_for(self, device: torch.device, size: int) -> tuple[torch.Tensor, ...]:
        """The tables and work buffers of ``device``, at least ``size`` words long (grown on
        demand up to :data:`CHUNK`: a word's table entry does not depend on the length)."""
        have = self._tables.get(device)
        if have is None or have[0].shape[0] < size:
            n = min(CHUNK, max(size, 2 * have[0].shape[0] if have else 1024))
            i = aten.arange.start(0, n, dtype=torch.int64, device=device)
            z = aten.add.Scalar(aten.mul.Scalar(i, _signed(0x9E3779B97F4A7C15)), 0x632BE59BD9B4E019)
            for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
                z = aten.bitwise_xor.Tensor(z, aten.bitwise_right_shift.Tensor_Scalar(z, shift))
                z = aten.mul.Scalar(z, _signed(mult))
            z = aten.bitwise_xor.Tensor(z, aten.bitwise_right_shift.Tensor_Scalar(z, 31))
            low = aten._to_copy.default(z, dtype=torch.int32)
            high = aten._to_copy.default(aten.bitwise_right_shift.Tensor_Scalar(z, 32), dtype=torch.int32)
            work = [aten.empty.memory_format([n], dtype=torch.int32, device=device) for _ in range(2)]
            self._tables[device] = (aten.bitwise_or.Scalar(low, 1), aten.bitwise_or.Scalar(high, 1), *work)
        return self._tables[device]


def _dense(t: torch.Tensor) -> bool:
    return t.dim() == 1 and (t.shape[0] <= 1 or t.stride(0) == 1)


def to_hex(sums: Sequence[torch.Tensor | None]) -> list[str | None]:
    """The 32-hex-digit strings of many :class:`Checksummer` results, one host copy per device."""
    out: list[str | None] = [None] * len(sums)
    by_device: dict[torch.device, list[int]] = {}
    for i, s in enumerate(sums):
        if s is not None:
            by_device.setdefault(s.device, []).append(i)
    for positions in by_device.values():
        values = aten.stack.default([sums[i] for i in positions]).tolist()
        for i, (s1, s2) in zip(positions, values):
            out[i] = f"{s1 & _MASK64:016x}{s2 & _MASK64:016x}"
    return out


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)
