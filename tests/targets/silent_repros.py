"""The reporters' repros of known MPS silent-correctness bugs, as steps opscan traces (tests/test_silent_repros.py).

One factory per entry of opscan/knowledge/silent_bugs.yaml, named `repro_<id>`: the call the issue (or the
regression test) reports, at the shape, dtype and layout it reports, wrapped in a small module. Where a
`near_<id>` exists it is the same step made safe the way the thread says (the contiguous copy, the offset-free
view, the size just under the threshold): the entry must not fire on it. Sizes over 2**31 elements run under
fake tensors (the test asks for them), so nothing here allocates more than a few MB.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class Call(nn.Module):
    """A parameterless module whose forward is `fn(*inputs)` (the repro's own call)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)


def _call(fn, *inputs):
    return Call(fn), inputs


# 161640: F.linear with a sliced (non-contiguous) weight on 2.8 (macOS 15+ no-graph path)
def repro_161640():
    return _call(lambda x, w: F.linear(x, w[:, ::2]), torch.randn(4, 16), torch.randn(16, 32))


def near_161640():
    return _call(lambda x, w: F.linear(x, w[:, ::2].contiguous()), torch.randn(4, 16), torch.randn(16, 32))


# 133520: bn(x[5:]) — batch norm of a batch slice (storage offset), FLUX/diffusers
class SliceNorm(nn.Module):
    def __init__(self, start):
        super().__init__()
        self.bn, self.start = nn.BatchNorm2d(4), start

    def forward(self, x):
        return self.bn(x[self.start:])


def repro_133520():
    return SliceNorm(5), torch.randn(10, 4, 8, 8)


def near_133520():
    return SliceNorm(0), torch.randn(10, 4, 8, 8)


# 187117: a_mps / s[4] with s a CPU schedule (0-dim CPU view with storage offset 4)
class Schedule(nn.Module):
    def __init__(self, moved):
        super().__init__()
        s = torch.rand(8) + 0.1
        if moved:
            self.register_buffer("s", s)  # moves to MPS with the model
        else:
            self.s = s  # a plain attribute: stays on the CPU on a Mac

    def forward(self, a):
        return a / self.s[4]


def repro_187117():
    return Schedule(moved=False), torch.randn(3, 4)


def near_187117():
    return Schedule(moved=True), torch.randn(3, 4)


# 145203: x[:, 0] ^= 1 — in-place xor into a column view
def repro_145203():
    def xor_column(x):
        x = x.clone()
        x[:, 0] ^= 1
        return x
    return _call(xor_column, torch.randint(0, 8, (4, 3)))


def near_145203():
    def xor_row(x):
        x = x.clone()
        x[0] ^= 1
        return x
    return _call(xor_row, torch.randint(0, 8, (4, 3)))


# 197636: bmm of (65537, 256, 64) by a transposed (65537, 64, 256): output over 2**32 elements (fake tensors)
def repro_197636():
    return _call(lambda a, b: torch.bmm(a, b.transpose(1, 2)), torch.randn(65537, 256, 64), torch.randn(65537, 256, 64))


def near_197636():
    return _call(torch.bmm, torch.randn(65537, 256, 64), torch.randn(65537, 64, 256))


# 189495: F.linear with bias on a contiguous 3-D float32 input whose batch dimension exceeds 65536
def repro_189495():
    return nn.Linear(16, 8), torch.randn(65537, 1, 16)


def near_189495():
    return nn.Linear(16, 8), torch.randn(65536, 1, 16)


# 163597: BERT's SDPA query, view(bsz, -1, heads, head).transpose(1, 2): non-contiguous, query length <= 8
class BertAttention(nn.Module):
    def __init__(self, contiguous=False):
        super().__init__()
        self.contiguous = contiguous

    def forward(self, hidden, kv):
        q = hidden.view(1, -1, 12, 64).transpose(1, 2)
        q = q.contiguous() if self.contiguous else q
        return F.scaled_dot_product_attention(q, kv, kv)


def repro_163597():
    return BertAttention(), (torch.randn(1, 4, 768), torch.randn(1, 12, 4, 64))


def near_163597():
    return BertAttention(contiguous=True), (torch.randn(1, 4, 768), torch.randn(1, 12, 4, 64))


# 181133: q, k, v as (B, S, H, D).permute(0, 2, 1, 3) with B > 1 (the vector kernel ignores the batch stride)
def repro_181133():
    return _call(lambda q, k, v: F.scaled_dot_product_attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3),
                                                              v.permute(0, 2, 1, 3)),
                 *[torch.randn(2, 4, 8, 64) for _ in range(3)])


def near_181133():
    return _call(lambda q, k, v: F.scaled_dot_product_attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3),
                                                              v.permute(0, 2, 1, 3)),
                 *[torch.randn(1, 4, 8, 64) for _ in range(3)])


# 192212: F.conv2d(x, weight5d[:, :, k]) — a non-contiguous weight
class SlicedKernel(nn.Module):
    def __init__(self, contiguous=False):
        super().__init__()
        self.weight5d = nn.Parameter(torch.randn(4, 3, 2, 3, 3))
        self.contiguous = contiguous

    def forward(self, x):
        w = self.weight5d[:, :, 1]
        return F.conv2d(x, w.contiguous() if self.contiguous else w)


def repro_192212():
    return SlicedKernel(), torch.randn(1, 3, 8, 8)


def near_192212():
    return SlicedKernel(contiguous=True), torch.randn(1, 3, 8, 8)


# 140902 / 142344: a ViT patch embedding, conv(x).flatten(2).transpose(1, 2): the conv's grad_output arrives
# transposed (channels-last strides)
class PatchEmbed(nn.Module):
    def __init__(self, transpose=True):
        super().__init__()
        self.proj, self.head, self.transpose = nn.Conv2d(3, 8, 4, stride=4), nn.Linear(8, 2), transpose

    def forward(self, x):
        x = self.proj(x).flatten(2)
        return self.head(x.transpose(1, 2) if self.transpose else x.mean(-1))


def repro_140902():
    return PatchEmbed(), torch.randn(2, 3, 16, 16)


def near_140902():
    return PatchEmbed(transpose=False), torch.randn(2, 3, 16, 16)


# 180201: a SIREN-like net, y = (sin(x @ w1.T + b1) @ w2.T + b2).squeeze(-1), differentiated through y.sum():
# the gradient reaching the matmul is an expanded (stride-0) tensor
class Siren(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(16, 3)), nn.Parameter(torch.randn(16))
        self.w2, self.b2 = nn.Parameter(torch.randn(1, 16)), nn.Parameter(torch.randn(1))

    def forward(self, x):
        return (torch.sin(x @ self.w1.T + self.b1) @ self.w2.T + self.b2).squeeze(-1)


def repro_180201():
    return Siren(), torch.randn(64, 3)


# 124621: Conv1d on a permuted input, its output permuted and sliced, into mse_loss(reduction='none')
class ConvMse(nn.Module):
    def __init__(self, contiguous=False):
        super().__init__()
        self.conv, self.contiguous = nn.Conv1d(3, 3, 1), contiguous

    def forward(self, x, y_hat):
        y = self.conv(x.permute(0, 2, 1)).permute(0, 2, 1)[:, :5, :]
        return F.mse_loss(y.contiguous() if self.contiguous else y, y_hat, reduction="none")


def repro_124621():
    return ConvMse(), (torch.randn(128, 10, 3), torch.randn(128, 5, 3))


def near_124621():
    return ConvMse(contiguous=True), (torch.randn(128, 10, 3), torch.randn(128, 5, 3))


# 124834: ELU of a transposed input
def repro_124834():
    return _call(lambda x: F.elu(x.t()), torch.randn(4, 3))


def near_124834():
    return _call(lambda x: F.elu(x.t().contiguous()), torch.randn(4, 3))


# 151460: x[::2].bitwise_not_()
def repro_151460():
    def invert_every_other(x):
        x = x.clone()
        x[::2].bitwise_not_()
        return x
    return _call(invert_every_other, torch.randint(0, 8, (8,), dtype=torch.int32))


def near_151460():
    def invert_head(x):
        x = x.clone()
        x[:4].bitwise_not_()
        return x
    return _call(invert_head, torch.randint(0, 8, (8,), dtype=torch.int32))


# 180984: conv2d on shared[:, :1], a channel slice of a channels_last tensor
def _channel_slice(contiguous):
    def conv_slice(shared, weight):
        task_slice = shared[:, :1]
        return F.conv2d(task_slice.contiguous() if contiguous else task_slice, weight)
    return _call(conv_slice, torch.randn(1, 2, 1, 2).contiguous(memory_format=torch.channels_last),
                 torch.randn(1, 1, 1, 1))


def repro_180984():
    return _channel_slice(False)


def near_180984():
    return _channel_slice(True)


# 188756: F.embedding over a table of more than 2**31 elements (fake tensors)
def repro_188756():
    return nn.Embedding(2 ** 22 + 1, 512), torch.tensor([0, 2 ** 22])


def near_188756():
    return nn.Embedding(2 ** 22, 512), torch.tensor([0, 2 ** 22 - 1])


# 180776: consecutive F.linear calls, fp16 input of rank > 2, no bias (M5, macOS 26.4)
def repro_180776():
    return _call(lambda x, w: F.linear(x, w) - F.linear(x, w), torch.randn(2, 13, 1024, dtype=torch.float16),
                 torch.randn(8, 1024, dtype=torch.float16))


def near_180776():
    return _call(lambda x, w, b: F.linear(x, w, b) - F.linear(x, w, b), torch.randn(2, 13, 1024, dtype=torch.float16),
                 torch.randn(8, 1024, dtype=torch.float16), torch.randn(8, dtype=torch.float16))


# 188438: F.linear with bias on a vector-shaped input (second-to-last dimension 1), macOS 26 on M1
def repro_188438():
    return nn.Linear(2, 4), torch.randn(80, 1, 2)


def near_188438():
    return nn.Linear(2, 4), torch.randn(80, 2, 2)


# 116769: (1024, 1) @ (1, 32769) on macOS 14
def repro_116769():
    return _call(torch.mm, torch.randn(1024, 1), torch.randn(1, 32769))


def near_116769():
    return _call(torch.mm, torch.randn(1024, 1), torch.randn(1, 32768))


# 174345: BatchNorm2d (eval) and avg_pool2d of a channels_last tensor with a storage offset
class OffsetChannelsLast(nn.Module):
    def __init__(self, start):
        super().__init__()
        self.bn, self.start = nn.BatchNorm2d(64).eval(), start

    def forward(self, x):
        x = x[:, self.start:].reshape(1, 8, 8, 64).permute(0, 3, 1, 2)
        return self.bn(x) + F.avg_pool2d(x, 2).mean()


def _offset_cl(start):
    return OffsetChannelsLast(start), torch.randn(1, 64 + start, 64)


def repro_174345():
    return _offset_cl(1)


def near_174345():
    return _offset_cl(0)


# 107694 (entry 110120): masked_fill_ on a transposed tensor
def repro_110120():
    def fill_transposed(x, mask):
        x = x.clone().t()
        return x.masked_fill_(mask, 0.0)
    return _call(fill_transposed, torch.randn(4, 3), torch.rand(3, 4) > 0.5)


def near_110120():
    def fill_contiguous(x, mask):
        x = x.clone().t().contiguous()
        return x.masked_fill_(mask, 0.0)
    return _call(fill_contiguous, torch.randn(4, 3), torch.rand(3, 4) > 0.5)


# 195163: bmm with K = 32768 and both output dimensions 16 (M1/M2)
def repro_195163():
    return _call(torch.bmm, torch.randn(2, 16, 32768), torch.randn(2, 32768, 16))


def near_195163():
    return _call(torch.bmm, torch.randn(2, 16, 32766), torch.randn(2, 32766, 16))


# 176767: q, k (1, 1, 16, 32) and v (1, 1, 16, 24): value head dim differs from the query's
def repro_176767():
    return _call(F.scaled_dot_product_attention, torch.randn(1, 1, 16, 32), torch.randn(1, 1, 16, 32),
                 torch.randn(1, 1, 16, 24))


def near_176767():
    return _call(F.scaled_dot_product_attention, torch.randn(1, 1, 16, 32), torch.randn(1, 1, 16, 32),
                 torch.randn(1, 1, 16, 32))


# 174861: one decode step with GQA: q (1, 32, 1, 128), k/v (1, 2, 1024, 128), bf16, enable_gqa
def _gqa(keys):
    return _call(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                 torch.randn(1, 32, 1, 128, dtype=torch.bfloat16), torch.randn(1, 2, keys, 128, dtype=torch.bfloat16),
                 torch.randn(1, 2, keys, 128, dtype=torch.bfloat16))


def repro_174861():
    return _gqa(1024)


def near_174861():
    return _gqa(512)


# 129207: nn.Conv1d(1, 65537, 3, padding=1) on ones(1, 1, 3)
def repro_129207():
    return nn.Conv1d(1, 65537, 3, padding=1), torch.ones(1, 1, 3)


def near_129207():
    return nn.Conv1d(1, 65536, 3, padding=1), torch.ones(1, 1, 3)


# 141471: nn.Conv3d on a channels_last_3d input
def repro_141471():
    return nn.Conv3d(2, 4, 3), torch.randn(1, 2, 6, 6, 6).contiguous(memory_format=torch.channels_last_3d)


def near_141471():
    return nn.Conv3d(2, 4, 3), torch.randn(1, 2, 6, 6, 6)


# 183825: F.layer_norm(x, (4,), w, b) with x (2, 4) not requiring grad, w and b requiring it
class FrozenInputNorm(nn.Module):
    def __init__(self, input_grad=False):
        super().__init__()
        self.norm, self.scale, self.input_grad = nn.LayerNorm(4), nn.Parameter(torch.ones(4)), input_grad

    def forward(self, x):
        return self.norm(x * self.scale if self.input_grad else x)


def repro_183825():
    return FrozenInputNorm(), torch.randn(2, 4)


def near_183825():
    return FrozenInputNorm(input_grad=True), torch.randn(2, 4)


# 124096 / 186885: rfft over dim 0 of a 6-D tensor (outside the last four)
def repro_124096():
    return _call(lambda x: torch.fft.rfft(x, dim=0).abs(), torch.randn(4, 2, 2, 2, 2, 8))


def near_124096():
    return _call(lambda x: torch.fft.rfft(x, dim=-1).abs(), torch.randn(4, 2, 2, 2, 2, 8))


# 182822: bitwise_and(a, base[1]) with base a bool tensor: a 0-dim view at byte offset 1
def _bitwise_scalar(index):
    return _call(lambda a, base: torch.bitwise_and(a, base[index]), torch.tensor([True, False, True]),
                 torch.tensor([True, False, True, False, True]))


def repro_182822():
    return _bitwise_scalar(1)


def near_182822():
    return _bitwise_scalar(4)


# 183631: x = zeros(16, bool); x[1:].fill_(True)
def _fill_from(start):
    def fill_tail(x):
        x = x.clone()
        x[start:].fill_(True)
        return x
    return _call(fill_tail, torch.zeros(16, dtype=torch.bool))


def repro_183631():
    return _fill_from(1)


def near_183631():
    return _fill_from(4)


# 114692: zero-fill a contiguous slice of a larger tensor (the out-of-bounds fill of test_fill_zeros)
def _zero_rows(start):
    def zero_rows(x):
        x = x.clone()
        x[start:start + 2].zero_()
        return x
    return _call(zero_rows, torch.randn(6, 4))


def repro_114692():
    return _zero_rows(2)


def near_114692():
    return _zero_rows(0)


# 163327: base[1].scatter_add_(0, idx, val) on a (2, 4) base
def _scatter_row(row):
    def scatter_row(base, idx, val):
        base = base.clone()
        base[row].scatter_add_(0, idx, val)
        return base
    return _call(scatter_row, torch.zeros(2, 4), torch.tensor([3, 2]), torch.ones(2))


def repro_163327():
    return _scatter_row(1)


def near_163327():
    return _scatter_row(0)


# 195074: base.narrow(0, off, 4).scatter_add_(0, idx, ones) on a bool base
def _bool_scatter(offset):
    def scatter_view(base, idx, src):
        base = base.clone()
        base.narrow(0, offset, 4).scatter_add_(0, idx, src)
        return base
    return _call(scatter_view, torch.zeros(8, dtype=torch.bool), torch.tensor([0, 2]), torch.ones(2, dtype=torch.bool))


def repro_195074():
    return _bool_scatter(1)


def near_195074():
    return _bool_scatter(4)


# 183419: randn(1_200_000, 464)[:, 4:50].neg() — byte-stride extent over INT32_MAX (fake tensors)
def repro_183419():
    return _call(lambda x: x[:, 4:50].neg(), torch.randn(1_200_000, 464))


def near_183419():
    return _call(lambda x: x[:, 4:50].neg(), torch.randn(1_000_000, 464))


# 182052: a strided copy out of a view reaching past element 2**32 (fake tensors)
def repro_182052():
    return _call(lambda x: x[:, 1::2].contiguous(), torch.randn(2 ** 17 + 8, 2 ** 15, dtype=torch.float16))


def near_182052():
    return _call(lambda x: x[:, 1::2].contiguous(), torch.randn(2 ** 17 - 8, 2 ** 15, dtype=torch.float16))


# 185663: aten.col2im(cols (1, 65537, 65537), [1, 131073], [1, 65537], ...) — K * L = 2**32 + 131074 (fake tensors)
def _col2im(k):
    return _call(lambda cols: torch.ops.aten.col2im(cols, [1, 2 * k - 1], [1, k], [1, 1], [0, 0], [1, 1]),
                 torch.randn(1, k, k))


def repro_185663():
    return _col2im(65537)


def near_185663():
    return _col2im(65536)


# 171602: F.grid_sample of a 5-D input with grid_base.permute(0, 2, 3, 4, 1)
def _grid3d(contiguous):
    def sample(inp, grid_base):
        grid = grid_base.permute(0, 2, 3, 4, 1)
        return F.grid_sample(inp, grid.contiguous() if contiguous else grid, align_corners=False)
    return _call(sample, torch.randn(1, 4, 4, 8, 8), torch.randn(1, 3, 4, 8, 8))


def repro_171602():
    return _grid3d(False)


def near_171602():
    return _grid3d(True)


# 174339: F.grid_sample of a channels_last input with an identity grid
def _grid2d(channels_last):
    x = torch.randn(1, 64, 16, 16)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    return _call(lambda x, grid: F.grid_sample(x, grid, align_corners=False), x, torch.rand(1, 16, 16, 2) * 2 - 1)


def repro_174339():
    return _grid2d(True)


def near_174339():
    return _grid2d(False)


# 175189: nn.BatchNorm2d(3) trained on a channels_last (4, 3, 8, 8) input
def repro_175189():
    return nn.BatchNorm2d(3), torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last)


def near_175189():
    return nn.BatchNorm2d(3), torch.randn(4, 3, 8, 8)


# 135447: nn.ReplicationPad1d((3, 4)) trained on a (65736, 2, 4) input
class PadThenScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.pad, self.scale = nn.ReplicationPad1d((3, 4)), nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.pad(x * self.scale)


def repro_135447():
    return PadThenScale(), torch.randn(65736, 2, 4)


def near_135447():
    return PadThenScale(), torch.randn(2, 65736, 4)


# 100764: torch.neg(x, out=torch.empty(2, 2).t())
def _neg_into(transposed):
    def neg_into(x, y):
        return torch.neg(x, out=y.t() if transposed else y)
    return _call(neg_into, torch.arange(4.0).reshape(2, 2), torch.empty(2, 2))


def repro_100764():
    return _neg_into(True)


def near_100764():
    return _neg_into(False)


# 118115: x.t().addcdiv_(y, z) — the optimizers' update on transposed operands
def _addcdiv(transposed):
    def update(x, y, z):
        x = x.clone()
        x = x.t() if transposed else x
        return x.addcdiv_(y, z)
    shape = (3, 2) if transposed else (2, 3)
    return _call(update, torch.rand(2, 3), torch.rand(*shape), torch.rand(*shape) + 1)


def repro_118115():
    return _addcdiv(True)


def near_118115():
    return _addcdiv(False)


# 95417: x_mps[2:4] = update (float16 into float32): copy_ with a cast into a sliced view
def _cast_into(start):
    def cast_into(x, update):
        x = x.clone()
        x[start:start + 2] = update
        return x
    return _call(cast_into, torch.zeros(6), torch.ones(2, dtype=torch.float16))


def repro_95417():
    return _cast_into(2)


def near_95417():
    return _cast_into(0)


# 189563: destination_storage[2:].copy_(source): float16 CPU view at offset 2 from a float32 MPS source
def _copy_to_host(start):
    def copy_out(source):
        destination = torch.empty(10, dtype=torch.float16)[start:start + 8]
        destination.copy_(source)
        return destination
    return _call(copy_out, torch.arange(8, dtype=torch.float32) + 0.25)


def repro_189563():
    return _copy_to_host(2)


def near_189563():
    return _copy_to_host(0)



# 149951: torch.rand(3).fmax(torch.arange(3., dtype=torch.half))
def repro_149951():
    return _call(torch.fmax, torch.rand(3), torch.arange(3.0, dtype=torch.half))


def near_149951():
    return _call(torch.fmax, torch.rand(3), torch.arange(3.0))


# 160208: torch.add(int tensor, float tensor, alpha=2)
def _add_alpha(dtype):
    return _call(lambda a, b: torch.add(a, b, alpha=2), torch.arange(4), torch.rand(4).to(dtype))


def repro_160208():
    return _add_alpha(torch.float32)


def near_160208():
    return _add_alpha(torch.int64)


# 144190: uint8 tensor >> 2
def repro_144190():
    return _call(lambda x: x >> 2, torch.arange(0, 256, 17, dtype=torch.uint8))


def near_144190():
    return _call(lambda x: x >> 2, torch.arange(0, 256, 17, dtype=torch.int32))


# 147889: 1 << torch.arange(8)
def repro_147889():
    return _call(lambda x: 1 << x, torch.arange(8))


def near_147889():
    return _call(lambda x: torch.ones_like(x) << x, torch.arange(8))


# 176296: a uint16 tensor / 64
def repro_176296():
    return _call(lambda x: x / 64, torch.arange(0, 4096, 64).to(torch.uint16))


def near_176296():
    return _call(lambda x: x / 64, torch.arange(0, 4096, 64).to(torch.int32))


# 151443: torch.isin(int64 elements, int32 test_elements)
def repro_151443():
    return _call(torch.isin, torch.arange(8), torch.tensor([1, 3, 5], dtype=torch.int32))


def near_151443():
    return _call(torch.isin, torch.arange(8), torch.tensor([1, 3, 5]))


# 160738: torch.var of a 0-dim tensor over dim 0
def repro_160738():
    return _call(lambda x: torch.var(x, dim=0), torch.tensor(1.5))


def near_160738():
    return _call(lambda x: torch.var(x, dim=0), torch.tensor([1.5, 2.5]))


# 189134: torch.linalg.solve(A (1, 3, 3), B (4, 3, 2)) — batch shapes that broadcast
def repro_189134():
    return _call(torch.linalg.solve, torch.randn(1, 3, 3) + 3 * torch.eye(3), torch.randn(4, 3, 2))


def near_189134():
    return _call(torch.linalg.solve, (torch.randn(1, 3, 3) + 3 * torch.eye(3)).expand(4, 3, 3).contiguous(),
                 torch.randn(4, 3, 2))


# 144245: F.interpolate of a (3, 1, 1) input to length 3, mode='linear'
def repro_144245():
    return _call(lambda x: F.interpolate(x, size=3, mode="linear"), torch.randn(3, 1, 1))


def near_144245():
    return _call(lambda x: F.interpolate(x, size=3, mode="linear"), torch.randn(3, 1, 2))


# 160743: F.avg_pool2d(x, 3, stride=2, ceil_mode=True, divisor_override=2)
def _avg(divisor):
    return _call(lambda x: F.avg_pool2d(x, 3, stride=2, ceil_mode=True, divisor_override=divisor),
                 torch.randn(1, 2, 6, 6))


def repro_160743():
    return _avg(2)


def near_160743():
    return _avg(None)


# 166746: BCELoss(reduction='none') on a (4, 1) prediction, trained
class BceNone(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin, self.width = nn.Linear(3, width), width

    def forward(self, x, target):
        return F.binary_cross_entropy(torch.sigmoid(self.lin(x)), target, reduction="none")


def repro_166746():
    return BceNone(1), (torch.randn(4, 3), torch.rand(4, 1))


def near_166746():
    return BceNone(2), (torch.randn(4, 3), torch.rand(4, 2))


# 187017: median over the last dim of a rank-5 tensor
def repro_187017():
    return _call(lambda x: x.median(dim=-1).values, torch.randn(2, 2, 2, 2, 5))


def near_187017():
    return _call(lambda x: x.median(dim=-1).values, torch.randn(2, 2, 2, 5))


# 95538: all() of a 6-D bool tensor
def repro_95538():
    return _call(lambda x: x.all(dim=0), torch.ones(2, 1, 1, 1, 1, 3, dtype=torch.bool))


def near_95538():
    return _call(lambda x: x.all(dim=0), torch.ones(2, 1, 3, dtype=torch.bool))


# 104879: torch.unique of a tensor reshaped to (1, 1, 2)
def repro_104879():
    return _call(lambda x: torch.unique(x.reshape(1, 1, 2)), torch.tensor([3.0, 1.0]))


def near_104879():
    return _call(lambda x: torch.unique(x), torch.tensor([3.0, 1.0]))


# 96614: cumsum of a bool tensor
def repro_96614():
    return _call(lambda x: x.cumsum(0), torch.tensor([True, False, True, True]))


def near_96614():
    return _call(lambda x: x.int().cumsum(0), torch.tensor([True, False, True, True]))


# 165257 / 124029: torch.rand_like of a permuted tensor (uniform_ of a non-contiguous empty_like)
def repro_165257():
    return _call(lambda x: torch.rand_like(x.permute(1, 0)), torch.randn(3, 4))


def near_165257():
    return _call(lambda x: torch.rand_like(x), torch.randn(3, 4))


# 125803: test_lstm_backward, an nn.LSTM trained (macOS 14.4)
def repro_125803():
    return nn.LSTM(4, 7, num_layers=1), torch.randn(5, 2, 4)


# 190056: nn.LSTM(4, 4, num_layers=2, dropout=0.5), trained
def repro_190056():
    return nn.LSTM(4, 4, num_layers=2, dropout=0.5), torch.randn(3, 2, 4)


def near_190056():
    return nn.LSTM(4, 4, num_layers=2, dropout=0.0), torch.randn(3, 2, 4)


# 115152: torch.zeros_like(x.permute(1, 0)).scatter_(0, idx, src)
def _scatter_into(permuted):
    def scatter(x, idx, src):
        y = torch.zeros_like(x.permute(1, 0) if permuted else x)
        return y.scatter_(0, idx, src)
    return _call(scatter, torch.randn(3, 3), torch.tensor([[0, 1, 2]]), torch.ones(1, 3))


def repro_115152():
    return _scatter_into(True)


def near_115152():
    return _scatter_into(False)


# 179352: SDPA at B=1, H=8, Lq=16384, Lk=65536, D=64: 2**33 scores (fake tensors)
def _big_sdpa(keys):
    return _call(F.scaled_dot_product_attention, torch.randn(1, 8, 16384, 64), torch.randn(1, 8, keys, 64),
                 torch.randn(1, 8, keys, 64))


def repro_179352():
    return _big_sdpa(65536)


def near_179352():
    return _big_sdpa(32768)


# 197114: nn.Conv3d(4, 4, 3, padding=1) on a contiguous (1, 4, 8, 8, 8) input (macOS 26.2)
def repro_197114():
    return nn.Conv3d(4, 4, 3, padding=1), torch.randn(1, 4, 8, 8, 8)


def near_197114():
    return nn.Conv3d(4, 4, 3, padding=1), torch.randn(1, 4, 8, 8, 8).contiguous(memory_format=torch.channels_last_3d)


# 156792: BatchNorm2d of a permuted NHWC view (channels-last strides, not dense)
class PermutedNorm(nn.Module):
    def __init__(self, dense):
        super().__init__()
        self.bn, self.dense = nn.BatchNorm2d(3), dense

    def forward(self, x):
        x = x if self.dense else x[:, :, :, :3]
        return self.bn(x.permute(0, 3, 1, 2))


def repro_156792():
    return PermutedNorm(dense=False), torch.randn(2, 4, 4, 5)


def near_156792():
    return PermutedNorm(dense=True), torch.randn(2, 4, 4, 3)


# 124335: torch.ones(2**30) (4 GiB of float32) moved to MPS inside the step (fake tensors)
class HostToDevice(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, dst):
        return dst.copy_(torch.ones(self.n))  # made without device=: a CPU tensor on a Mac, copied to MPS


def repro_124335():
    return HostToDevice(2 ** 30), torch.empty(2 ** 30)


def near_124335():
    return HostToDevice(2 ** 30 - 1), torch.empty(2 ** 30 - 1)


# 90421: a bidirectional 2-layer nn.LSTM(5, 5) on a batch of 2 sequences of 4
def repro_90421():
    return nn.LSTM(5, 5, num_layers=2, bidirectional=True).eval(), torch.randn(4, 2, 5)


def near_90421():
    return nn.LSTM(5, 5, num_layers=2, bidirectional=True).eval(), torch.randn(4, 1, 5)


# 175192: torch.linalg.solve(A (3, 4, 4), B (3, 4, 2)).sum().backward()
class Solve(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(3, 4, 4) + 3 * torch.eye(4))

    def forward(self, b):
        return torch.linalg.solve(self.a, b)


def repro_175192():
    return Solve(), torch.randn(3, 4, 2)


def near_175192():
    return _call(lambda a, b: torch.linalg.solve(a, b), torch.randn(3, 4, 4) + 3 * torch.eye(4), torch.randn(3, 4, 2))


# test_mm_strided_output / PR #193385: torch.mm(a, b, out=buf[1]) (macOS 14's gather path)
def _mm_into(sliced):
    def mm_into(a, b, buf):
        return torch.mm(a, b, out=buf[1] if sliced else buf[0].clone())
    return _call(mm_into, torch.randn(4, 6), torch.randn(6, 5), torch.zeros(3, 4, 5))


def repro_test_mm_strided_output():
    return _mm_into(True)


def near_test_mm_strided_output():
    return _mm_into(False)


# 188335: a 2-D convolution with a (1, 256) kernel (test_conv2d_filter_dim_ge_256)
def repro_188335():
    return nn.Conv2d(2, 2, kernel_size=(1, 256)), torch.randn(1, 2, 4, 300)


def near_188335():
    return nn.Conv2d(2, 2, kernel_size=(1, 255)), torch.randn(1, 2, 4, 300)


# 153560: output[batch_idx] of the (11, 20064, 20064) bfloat16 bmm output (fake tensors)
def _index_rows(n):
    return _call(lambda x, idx: x[idx], torch.randn(11, 20064, n, dtype=torch.bfloat16), torch.tensor([3, 7]))


def repro_153560():
    return _index_rows(20064)


def near_153560():
    return _index_rows(19000)


# 185119: nn.Embedding(10, 4, scale_grad_by_freq=True), trained
def _freq_embedding(scale):
    return nn.Embedding(10, 4, scale_grad_by_freq=scale), torch.tensor([[1, 2, 2, 5, 1], [3, 3, 3, 0, 9]])


def repro_185119():
    return _freq_embedding(True)


def near_185119():
    return _freq_embedding(False)


# 189565 (PR #189565): F.linear(x (3840, 33), w (1, 33)).sum().backward(): the incoming gradient is expanded
class OneOutput(nn.Module):
    def __init__(self, out_features):
        super().__init__()
        self.w = nn.Parameter(torch.randn(out_features, 33))

    def forward(self, x):
        return F.linear(x, self.w).sum()


def repro_189565():
    return OneOutput(1), torch.randn(3840, 33)


def near_189565():
    return OneOutput(2), torch.randn(3840, 33)


@dataclass(frozen=True)
class Repro:
    """How to scan an entry's repro: an affected release, the macOS and chip it needs, and the step's mode."""

    release: str
    macos: str | None = None
    chip: str | None = None
    train: bool = False  # the whole training step (the entry is on a backward op); else forward only
    fake: bool = False  # fake tensors (the repro is over 2**31 elements)
    near: bool = True  # a near_<id> factory exists


REPROS = {
    "161640": Repro("2.8.0", macos="15.0"),
    "133520": Repro("2.4.0", train=True),
    "187117": Repro("2.12.0"),
    "145203": Repro("2.5.0", macos="15.0"),
    "197636": Repro("2.14.1", macos="15.0", fake=True),  # below 15 the bmm tiling check raises first
    "189495": Repro("2.12.0", macos="15.0"),
    "163597": Repro("2.8.0", macos="15.0"),  # a non-contiguous query reaches the MPS kernel on macOS 15+ only
    "181133": Repro("2.10.0", macos="15.0"),
    "192212": Repro("2.13.0", macos="15.0"),
    "140902": Repro("2.5.0", train=True),
    "180201": Repro("2.11.0", macos="15.0", train=True, near=False),
    "124621": Repro("2.3.0"),
    "124834": Repro("2.3.0"),
    "151460": Repro("2.7.0"),
    "180984": Repro("2.12.0"),
    "188756": Repro("2.13.0", fake=True),
    "180776": Repro("2.12.0", macos="26.4", chip="M5"),
    "188438": Repro("2.13.0", macos="26.0", chip="M1", train=True),
    "116769": Repro("2.2.0", macos="14.1"),
    "174345": Repro("2.11.0"),
    "110120": Repro("2.1.0"),
    "195163": Repro("2.13.0", chip="M2"),
    "176767": Repro("2.11.0"),
    "174861": Repro("2.10.0"),
    "129207": Repro("2.4.0"),
    "141471": Repro("2.5.0", macos="13.2"),  # below 13.2 MPS refuses Conv3D (kernel-conv3d-macos-13-2)
    "183825": Repro("2.12.0", train=True),
    "124096": Repro("2.13.0"),
    "182822": Repro("2.12.0"),
    "183631": Repro("2.12.0"),
    "114692": Repro("2.1.0"),
    "163327": Repro("2.14.1"),
    "195074": Repro("2.14.1"),
    "183419": Repro("2.12.0", fake=True),
    "182052": Repro("2.12.0", fake=True),
    "185663": Repro("2.12.0", fake=True),
    "171602": Repro("2.10.0"),
    "174339": Repro("2.14.1"),
    "175189": Repro("2.13.0", macos="15.0", train=True),
    "135447": Repro("2.7.0", train=True),
    "100764": Repro("2.0.0"),
    "118115": Repro("2.2.0"),
    "95417": Repro("2.0.0"),
    "189563": Repro("2.13.0"),
    "149951": Repro("2.7.0"),
    "160208": Repro("2.8.0"),
    "144190": Repro("2.5.0"),
    "147889": Repro("2.6.0"),
    "176296": Repro("2.11.0"),
    "151443": Repro("2.7.0", macos="14.0"),  # below 14 isin refuses int64 (kernel-floating-only-macos-14)
    "160738": Repro("2.8.0"),
    "189134": Repro("2.13.0"),
    "144245": Repro("2.6.0"),
    "160743": Repro("2.8.0"),
    "166746": Repro("2.9.0", train=True),
    "187017": Repro("2.13.0"),
    "95538": Repro("2.0.0"),
    "104879": Repro("2.0.0", macos="13.0"),  # below macOS 13 the kernel runs unique on the CPU itself
    "96614": Repro("2.0.0", macos="13.2"),  # below 13.2 cumsum runs on the CPU (in-kernel fallback)
    "165257": Repro("2.9.0", macos="14.0"),
    "125803": Repro("2.3.0", macos="14.4", train=True, near=False),
    "190056": Repro("2.13.0", train=True),
    "115152": Repro("2.2.0"),
    "179352": Repro("2.12.0", fake=True),
    "197114": Repro("2.14.1", macos="26.2"),
    "156792": Repro("2.12.0"),
    "124335": Repro("2.3.0", fake=True),
    "90421": Repro("2.0.0", macos="13.0"),  # below 13 a multi-layer LSTM raises (kernel-lstm-multilayer)
    "175192": Repro("2.11.0", train=True),
    "test_mm_strided_output": Repro("2.13.0", macos="14.0"),
    "188335": Repro("2.12.0"),
    "153560": Repro("2.7.0", macos="14.0", fake=True),  # bfloat16 needs macOS 14
    "185119": Repro("2.12.0", train=True),
    "189565": Repro("2.13.0", train=True),
}
