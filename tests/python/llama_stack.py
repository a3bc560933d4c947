"""A stack of Llama-shaped blocks (attention projections + gated MLP) for the GPU tests and
bench/python/model_bench.py. Attention itself is replaced by a per-token gate that uses q, k
and v (GQA head layout), so every projection stays live under torch.compile while the only
GEMMs are the seven nn.Linear layers of a Llama block."""

import torch
from torch import nn

#: Llama-3-8B: hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336.
LLAMA3_8B = dict(d=4096, heads=32, kv_heads=8, ff=14336)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * \
            self.weight


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, ff):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.q_proj = nn.Linear(d, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, d, bias=False)
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        m = x.shape[0]
        h = self.attn_norm(x)
        q = self.q_proj(h).view(m, self.kv_heads, -1, self.hd)
        k = self.k_proj(h).view(m, self.kv_heads, 1, self.hd)
        v = self.v_proj(h).view(m, self.kv_heads, 1, self.hd)
        gate = torch.sigmoid((q * k).sum(-1, keepdim=True) * self.hd ** -0.5)
        x = x + self.o_proj((gate * v).reshape(m, -1))
        h = self.mlp_norm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class Stack(nn.Module):
    def __init__(self, layers, d, heads, kv_heads, ff):
        super().__init__()
        self.layers = nn.ModuleList(Block(d, heads, kv_heads, ff) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def make_stack(layers, dtype=torch.bfloat16, device="cuda", seed=0, **dims):
    """A Stack with Gaussian weights of std 1/sqrt(fan_in) (unit-variance activations)."""
    dims = dims or LLAMA3_8B
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = Stack(layers, **dims)
    model = model.to_empty(device="cpu")
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.ones_(p)
        else:
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5)
    return model.to(device=device, dtype=dtype).eval()


def capture(fn, *args, warmup=2):
    """A CUDA graph of fn(*args), after `warmup` calls on the capture stream (nibble's split-K
    workspace is allocated per stream on first use, and graphs cannot allocate it). Returns
    (graph, static output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn(*args)
    return graph, out
