"""A 64-bit fingerprint of a tensor's bytes, read once, with no temporary larger than a small chunk.

The bytes are read as 32-bit words (two's complement ``int32``), laid out in blocks of
``BLOCK_ROWS`` rows of ``COLS`` words (4 MiB per block). Each block is reduced, column by column,
to ``COLS`` column hashes ``h[k] = wrap32(sum_r w[r] * x[r, k])`` with fixed odd row weights ``w``
(one integer matrix product: on CPU a fused ``matmul`` that reads the block once and writes only
the ``COLS`` results); the column hashes of every block combine as ``sum key[b, k] * h[b, k]``
modulo 2**64 with fixed odd 64-bit keys that depend on the block and the column. The last partial
block, the last partial row and the last 1-3 bytes are zero-padded. Weights and keys come from a
fixed integer mixer, so they are the same on every rank, machine and PyTorch version, and integer
arithmetic makes the result independent of the reduction order and of thread counts.

What it guarantees (``fingerprint(a) != fingerprint(b)`` for tensors of the same shape and dtype):

* any change to one 32-bit word (one float32, or up to two bfloat16/float16 elements sharing a
  word, one flipped bit included) changes the fingerprint, always: an odd weight times a non-zero
  32-bit difference is non-zero modulo 2**32, and so is its product with an odd key modulo 2**64;
* so it compares bits, not values: ``-0.0`` and ``0.0`` differ, NaNs with different payloads
  differ, and bitwise-identical NaNs are equal;
* elements moved to another column or block (a permutation of a large tensor) change it unless
  64-bit keys collide; elements swapped within one column of one block change it unless 32-bit
  weights collide. The one blind spot of 32-bit weights: swapping two words of the same column of
  a block that differ only in their top bit (``x`` and ``-x`` in float32) is not seen.

Memory: the words are views of the tensor's own storage (no copy) whenever it is contiguous and
4-byte aligned. The temporaries are the column hashes and their products with the keys: at most
``CHUNK_BYTES`` (4 MiB) whatever the tensor size, because large tensors are processed in groups
of blocks. Tensors that are not contiguous (or not aligned) are copied piece by piece into one
4 MiB block buffer, in logical element order. The one exception: a sparse tensor is made dense
first. On devices other than the CPU, which have no fused integer matrix product, each block is
hashed with a multiply and a sum, whose product is one block: again at most ``CHUNK_BYTES``.

Many tensors at once (:func:`fingerprint_many`, what ``assert_in_sync`` uses): on a GPU a few kernels
per tensor cost more than reading a ~100-tensor model once, so there the small tensors (every one that
is contiguous, whole 32-bit words and at most ``PACK_WORDS`` words) are hashed together, a pack of
them at a time: one copy joins their words, one multiply weighs each word by its row's weight, one
``index_add_`` sums each tensor's columns, one product with the keys combines them: the same value,
word for word, as one tensor at a time, in a fixed number of kernels per pack. The pack's word-to-row
and word-to-column tables depend only on the tensors' sizes and are kept for the next call (a model's
sizes do not change between steps).
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

__all__ = ["fingerprint", "fingerprint_tensor", "fingerprint_many", "combine_fingerprints", "flat_pieces",
           "strided_real", "CHUNK_BYTES", "COLS", "BLOCK_ROWS", "BLOCK_WORDS"]

COLS = 1024  # 32-bit words per row
BLOCK_ROWS = 1024  # rows per block
BLOCK_WORDS = COLS * BLOCK_ROWS  # 1 Mi words: 4 MiB per block
CHUNK_BYTES = 4 << 20  # the largest temporary the fingerprint allocates, whatever the tensor size
# Blocks per fused product: their column hashes (int32), the int64 copy, its product with the keys,
# and the keys (int64) must each stay within CHUNK_BYTES.
GROUP_BLOCKS = CHUNK_BYTES // (8 * COLS)  # 512 blocks (2 GiB of input) per product
# Words per pack of small tensors in fingerprint_many: its int64 column index stays within CHUNK_BYTES.
PACK_WORDS = CHUNK_BYTES // 8

_WEIGHT_SALT = 0x5EED_D0C
_KEY_SALT = 0x0DD_CE11 << 32
_weights: dict[torch.device, torch.Tensor] = {}
_keys: dict[torch.device, torch.Tensor] = {}
_packs: dict = {}  # (device, word counts) -> (row weight per word, column slot per word); a few kept
_PACKS_KEPT = 16


def _signed(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _mix(z: torch.Tensor) -> torch.Tensor:
    """A splitmix64-style finalizer in wrapping int64 arithmetic: a fixed function of each value."""
    z = z * _signed(0x9E3779B97F4A7C15) + _signed(0x632BE59BD9B4E019)
    z = (z ^ (z >> 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> 27)) * _signed(0x94D049BB133111EB)
    return z ^ (z >> 31)


def _row_weights(device: torch.device) -> torch.Tensor:
    """The fixed odd int32 row weights, one per row of a block, cached per device."""
    w = _weights.get(device)
    if w is None:
        mixed = _mix(torch.arange(BLOCK_ROWS, dtype=torch.int64) + _WEIGHT_SALT) | 1
        w = _weights[device] = mixed.to(torch.int32).to(device)  # int64 -> int32 keeps the low bits
    return w


def _block_keys(first: int, count: int, device: torch.device) -> torch.Tensor:
    """Odd int64 keys of shape ``(count, COLS)`` for blocks ``first .. first+count-1``.

    The keys of the first GROUP_BLOCKS blocks are cached per device, computed as far as a tensor
    needed them (doubling): a model of small tensors computes one block's keys, not 4 MiB of them.
    """
    need = first + count
    if need <= GROUP_BLOCKS:
        cached = _keys.get(device)
        have = 0 if cached is None else cached.shape[0]
        if have < need:
            size = min(GROUP_BLOCKS, max(need, 2 * have))
            index = torch.arange(have * COLS, size * COLS, dtype=torch.int64)
            more = (_mix(index + _KEY_SALT) | 1).view(size - have, COLS).to(device)
            cached = _keys[device] = more if cached is None else torch.cat([cached, more])
        return cached[first:need]
    index = torch.arange(first * COLS, (first + count) * COLS, dtype=torch.int64, device=device)
    return (_mix(index + _KEY_SALT) | 1).view(count, COLS)  # tensors over 2 GiB: computed per group


def _column_hashes(blocks: torch.Tensor, w: torch.Tensor, fused: bool) -> torch.Tensor:
    """``wrap32(sum_r w[r] * blocks[g, r, k])`` for every block ``g`` and column ``k``: ``(G, COLS)``."""
    count, rows = blocks.shape[0], blocks.shape[1]
    if fused:  # one integer matrix product: reads each block once, writes COLS words per block
        return torch.matmul(w[:rows].view(1, 1, rows), blocks).view(count, COLS)
    # The same value without an integer matmul (CUDA has none): two kernels a block, into one product
    # buffer of one block (the largest temporary) and one row of the group's hashes.
    hashes = torch.empty(count, COLS, dtype=torch.int32, device=blocks.device)
    product = torch.empty(rows, COLS, dtype=torch.int32, device=blocks.device)
    weights = w[:rows].view(rows, 1)
    for g in range(count):
        torch.mul(blocks[g], weights, out=product)
        torch.sum(product, dim=0, dtype=torch.int32, out=hashes[g])
    return hashes


def _combine(hashes: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    return (hashes.to(torch.int64) * keys).sum()


class _Hasher:
    """Accumulates the fingerprint of one word stream, block by block, on one device."""

    def __init__(self, device: torch.device, fused: Optional[bool]) -> None:
        self.device = device
        self.fused = device.type == "cpu" if fused is None else fused
        self.group = GROUP_BLOCKS
        self.w = _row_weights(device)
        self.total = torch.zeros((), dtype=torch.int64, device=device)
        self.blocks = 0  # blocks hashed so far

    def full_blocks(self, words: torch.Tensor) -> None:
        """Hash ``words`` (a multiple of BLOCK_WORDS int32 words) as the next blocks."""
        count = words.numel() // BLOCK_WORDS
        for first in range(0, count, self.group):
            n = min(self.group, count - first)
            part = words[first * BLOCK_WORDS:(first + n) * BLOCK_WORDS].view(n, BLOCK_ROWS, COLS)
            keys = _block_keys(self.blocks, n, self.device)
            self.total = self.total + _combine(_column_hashes(part, self.w, self.fused), keys)
            self.blocks += n

    def last_block(self, words: torch.Tensor, extra: Optional[torch.Tensor]) -> None:
        """Hash the last, partial block: fewer than BLOCK_WORDS words, then 1-3 padded bytes."""
        rows, tail = divmod(words.numel(), COLS)
        if rows == 0 and tail == 0 and extra is None:
            return
        if rows:
            hashes = _column_hashes(words[:rows * COLS].view(1, rows, COLS), self.w, self.fused)
        else:
            hashes = torch.zeros(1, COLS, dtype=torch.int32, device=self.device)
        if tail or extra is not None:
            row = torch.zeros(COLS, dtype=torch.int32, device=self.device)
            row[:tail] = words[rows * COLS:]
            if extra is not None:
                row[tail] = extra
            hashes = hashes + row * self.w[rows]
        self.total = self.total + _combine(hashes, _block_keys(self.blocks, 1, self.device))
        self.blocks += 1


def _padded_word(raw: torch.Tensor) -> Optional[torch.Tensor]:
    """The last 1-3 bytes of a byte stream, zero-padded to one int32 word; None when there are none."""
    if raw.numel() == 0:
        return None
    word = torch.zeros(4, dtype=torch.uint8, device=raw.device)
    word[:raw.numel()] = raw
    return word.view(torch.int32)[0]


def strided_real(t: torch.Tensor) -> torch.Tensor:
    """The tensor with the dtype quirks removed: strided, real, and a byte-viewable dtype."""
    t = t.detach()
    if t.layout != torch.strided:  # sparse gradients (nn.Embedding(sparse=True))
        t = t.to_dense()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t


def flat_pieces(t: torch.Tensor, max_bytes: int = CHUNK_BYTES) -> Iterator[torch.Tensor]:
    """The elements of a strided tensor in logical (row-major) order, as flat contiguous pieces.

    A contiguous tensor comes out as one view (no copy); any other is copied a few rows at a time,
    each piece at most ``max_bytes`` (or one element), never the whole tensor at once.
    """
    if t.is_contiguous():
        flat = t.reshape(-1)
        yield flat if flat.numel() != 1 else flat.clone(memory_format=torch.contiguous_format)
        return
    row = t[0].numel() * t.element_size() if t.shape[0] else 0
    if row == 0:
        return
    if row <= max_bytes:
        step = max(1, max_bytes // row)
        for i in range(0, t.shape[0], step):
            yield t[i:i + step].contiguous().reshape(-1)
    else:
        for i in range(t.shape[0]):
            yield from flat_pieces(t[i], max_bytes)


def _streamed(t: torch.Tensor, hasher: _Hasher) -> None:
    """Hash a tensor with no aligned in-place word view by copying it through one block buffer."""
    buf = torch.empty(BLOCK_WORDS, dtype=torch.int32, device=hasher.device)
    buf_bytes = buf.view(torch.uint8)
    fill = 0
    for piece in flat_pieces(t):
        raw = piece.view(torch.uint8)
        pos = 0
        while pos < raw.numel():
            n = min(buf_bytes.numel() - fill, raw.numel() - pos)
            buf_bytes[fill:fill + n].copy_(raw[pos:pos + n])
            fill, pos = fill + n, pos + n
            if fill == buf_bytes.numel():
                hasher.full_blocks(buf)
                fill = 0
    whole = fill // 4 * 4
    hasher.last_block(buf[:whole // 4], _padded_word(buf_bytes[whole:fill]))


def fingerprint_tensor(t: torch.Tensor, *, fused: Optional[bool] = None) -> torch.Tensor:
    """The fingerprint as a 0-dim int64 tensor on the tensor's device (no host synchronization).

    Args:
        t: any tensor (dense, sparse, complex, bool, any size).
        fused: hash with one integer matrix product per group of blocks (the CPU default), or with
            a multiply and a sum per block (the default elsewhere). Both give the same value; the
            argument exists so that the non-CPU code path runs, and is tested, on a CPU.
    """
    flat = strided_real(t)
    hasher = _Hasher(flat.device, fused)
    if flat.numel() == 0:
        return hasher.total
    if flat.is_contiguous():
        raw = next(flat_pieces(flat)).view(torch.uint8)
        whole = raw.numel() // 4 * 4
        try:
            words = raw[:whole].view(torch.int32)
        except RuntimeError:  # storage offset not 4-byte aligned: copy through the block buffer
            words = None
        if words is not None:
            full = words.numel() // BLOCK_WORDS * BLOCK_WORDS
            hasher.full_blocks(words[:full])
            hasher.last_block(words[full:], _padded_word(raw[whole:]))
            return hasher.total
    _streamed(flat, hasher)
    return hasher.total


_DIGEST_SALT = 0xD16E57 << 40


def combine_fingerprints(values: torch.Tensor) -> torch.Tensor:
    """One 64-bit digest of a 1-D int64 tensor of fingerprints, in order: ``sum key[i] * values[i]``
    modulo 2**64 with fixed odd keys (0-dim int64, on the values' device, no host synchronization).

    A change to any one fingerprint always changes the digest (an odd key times a non-zero
    difference is non-zero modulo 2**64); changes to several cancel only if 64-bit sums collide.
    """
    index = torch.arange(values.numel(), dtype=torch.int64, device=values.device)
    return ((_mix(index + _DIGEST_SALT) | 1) * values.reshape(-1)).sum()


def fingerprint(t: torch.Tensor) -> int:
    """An order-sensitive 64-bit fingerprint of the tensor's bytes, as a signed int64 value.

    Equal on every rank for bitwise-equal tensors; different for any single-word change (see the
    module docstring for exactly what it guarantees).
    """
    return int(fingerprint_tensor(t))


def _pack_tables(device: torch.device, counts: tuple) -> tuple:
    """For words joined from tensors of ``counts`` words: each word's row weight and its column slot
    (``tensor * COLS + column``), as one tensor at a time would use them."""
    key = (device, counts)
    tables = _packs.get(key)
    if tables is None:
        total = sum(counts)
        owner = torch.repeat_interleave(torch.arange(len(counts), dtype=torch.int64),
                                        torch.tensor(counts, dtype=torch.int64))
        starts = torch.tensor([0, *counts[:-1]], dtype=torch.int64).cumsum(0)
        local = torch.arange(total, dtype=torch.int64) - starts[owner]
        weight = _row_weights(torch.device("cpu"))[local // COLS]
        slot = owner * COLS + local % COLS
        if len(_packs) >= _PACKS_KEPT:
            _packs.pop(next(iter(_packs)))
        tables = _packs[key] = (weight.to(device), slot.to(device))
    return tables


def _packable(t: torch.Tensor) -> bool:
    """Hashed in a pack: contiguous whole 32-bit words at an aligned offset, one partial block at most."""
    nbytes = t.numel() * t.element_size()
    return (t.is_contiguous() and 0 < nbytes <= PACK_WORDS * 4 and nbytes % 4 == 0
            and (t.storage_offset() * t.element_size()) % 4 == 0)


def _hash_pack(flats: list, device: torch.device) -> torch.Tensor:
    """The fingerprints of small tensors hashed together: the same values as one at a time."""
    counts = tuple(t.numel() * t.element_size() // 4 for t in flats)
    words = torch.cat([t.reshape(-1).view(torch.uint8) for t in flats]).view(torch.int32)
    weight, slot = _pack_tables(device, counts)
    hashes = torch.zeros(len(flats) * COLS, dtype=torch.int32, device=device)
    hashes.index_add_(0, slot, words * weight)  # wrapping int32 sums, as the per-tensor column hashes
    return (hashes.view(len(flats), COLS).to(torch.int64) * _block_keys(0, 1, device)).sum(dim=1)


def fingerprint_many(tensors: list, *, fused: Optional[bool] = None) -> torch.Tensor:
    """The fingerprints of many tensors (all on one device), as an int64 tensor of their count.

    ``fingerprint_many(ts)[i] == fingerprint_tensor(ts[i])`` for every i; on devices other than the
    CPU (or with ``fused=False``) the small tensors are hashed in packs (see the module docstring), so
    the number of kernels grows with the model's bytes, not with its number of tensors.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.int64)
    flats = [strided_real(t) for t in tensors]
    device = flats[0].device
    if (device.type == "cpu" if fused is None else fused):
        return torch.stack([fingerprint_tensor(t, fused=fused) for t in flats])
    out = torch.zeros(len(flats), dtype=torch.int64, device=device)
    pack: list = []
    pack_words = 0

    def flush() -> None:
        if pack:
            out.index_copy_(0, torch.tensor([i for i, _ in pack], device=device),
                            _hash_pack([t for _, t in pack], device))
            pack.clear()

    for i, t in enumerate(flats):
        if not _packable(t):
            out[i] = fingerprint_tensor(t, fused=False)
            continue
        words = t.numel() * t.element_size() // 4
        if pack_words + words > PACK_WORDS:
            flush()
            pack_words = 0
        pack.append((i, t))
        pack_words += words
    flush()
    return out
