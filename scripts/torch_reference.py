"""kiln's built-in model families as PyTorch modules, under the names `kiln export --format
pytorch` writes: the reference that `check-export.py` loads exports into, and that the PyTorch
side of kiln's benchmarks (`torch_baseline.py`, `torch_memory.py`) trains.

  mlp: Linear(in, hidden...) -> act -> ... -> Linear(.., classes), an nn.Sequential.
  cnn: per stage Conv2d(c_in, c, k, padding=k//2) -> act -> MaxPool2d(2), then Flatten ->
       Linear(.., hidden) -> act -> ... -> Linear(.., classes), an nn.Sequential.
  gpt: nanoGPT's layout: token + learned position embeddings, pre-LN blocks
       x + attn(ln_1(x)), x + mlp(ln_2(x)) with causal self-attention, an MLP of 4 x dim with
       GELU, a final LayerNorm and lm_head (tied to wte by default).

Importing it runs nothing.
"""
import torch
import torch.nn as nn

ACTS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


class Block(nn.Module):
    """A nanoGPT block (biases optional, as kiln's `model.bias`)."""

    def __init__(self, d, h, bias=True):
        super().__init__()
        self.ln_1, self.ln_2, self.h = nn.LayerNorm(d, bias=bias), nn.LayerNorm(d, bias=bias), h
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=bias), nn.Linear(d, d, bias=bias)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=bias), nn.GELU(), nn.Linear(4 * d, d, bias=bias))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """kiln's gpt. `init=True` applies nanoGPT's initialisation (normal 0.02, residual
    projections scaled by 1/sqrt(2 x layers), zero biases). The forward returns the logits
    flattened to [batch x positions, vocab]."""

    def __init__(self, vocab, block, layers, heads, d, bias=True, tie=True, init=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.Sequential(*[Block(d, heads, bias) for _ in range(layers)])
        self.ln_f, self.lm_head = nn.LayerNorm(d, bias=bias), nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight
        if init:
            for name, p in self.named_parameters():
                if name.endswith("bias") or name.startswith("ln") or ".ln_" in name:
                    continue
                std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("c_proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            for m in self.modules():
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.ln_f(self.blocks(self.wte(idx) + self.wpe(pos)))
        return self.lm_head(x).flatten(0, 1)


def mlp(sizes, act="relu", dropout=0.0):
    """Linear layers of `sizes` ([in, hidden..., classes]) with `act` (and dropout) between."""
    mods = []
    for i in range(len(sizes) - 1):
        mods.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            mods.append(ACTS[act]())
            if dropout > 0:
                mods.append(nn.Dropout(dropout))
    return nn.Sequential(*mods)


def cnn(image, channels, hidden, classes, kernel=3, act="relu"):
    """Conv stages of `channels` on images `image` = (C, H, W), then Linear layers `hidden`
    (an int or a list) to `classes`."""
    c, h, w = image
    mods, cin = [], c
    for ch in channels:
        mods += [nn.Conv2d(cin, ch, kernel, padding=kernel // 2), ACTS[act](), nn.MaxPool2d(2)]
        cin, h, w = ch, h // 2, w // 2
    hidden = [hidden] if isinstance(hidden, int) else list(hidden)
    return nn.Sequential(*mods, nn.Flatten(), *mlp([cin * h * w, *hidden, classes], act))
