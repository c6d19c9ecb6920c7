#!/usr/bin/env python3
"""Makes the TorchScript archives the tests and benchmarks load, as a user of PyTorch would:
models defined in Python, scripted (or traced) and saved with torch.jit.save.

Usage: make_torchscript_models.py OUT_DIR

Writes into OUT_DIR (each archive also has a `.json` sidecar naming its example inputs):
  cnn.pt          a ResNet-style CNN (conv-BN-ReLU blocks with residual adds), scripted
  encoder.pt      a transformer encoder (2 layers) taking a key padding mask, scripted
  lstm.pt         an LSTM classifier whose forward loops over time steps in TorchScript
  branchy_mlp.pt  an MLP with a branch on tensor data (`if x.sum() > 0`), scripted
  submethod.pt    a model whose forward calls a submodule's exported method; also exports `encode`
  traced_mlp.pt   an MLP saved by torch.jit.trace

The weights come from a fixed seed, so the files are the same on every run of one PyTorch
version. Needs Python's torch (Debian: python3-torch); any version from 1.13 on.
"""
import json
import os
import sys
from typing import List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        skip = x
        if self.down is not None:
            skip = self.down(x)
        return F.relu(y + skip)


class ResNetish(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.layers = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2))
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class Encoder(nn.Module):
    def __init__(self, d_model: int = 128, heads: int = 4, layers: int = 2, vocab: int = 1000):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 2)

    def forward(self, tokens, padding_mask):
        h = self.encoder(self.embed(tokens), src_key_padding_mask=padding_mask)
        keep = (~padding_mask).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.head(pooled)


class LoopLSTM(nn.Module):
    def __init__(self, features: int = 32, hidden: int = 64, classes: int = 5):
        super().__init__()
        self.cell = nn.LSTMCell(features, hidden)
        self.out = nn.Linear(hidden, classes)
        self.hidden = hidden

    def forward(self, x):  # x: [T, B, features]
        h = torch.zeros(x.size(1), self.hidden, dtype=x.dtype)
        c = torch.zeros(x.size(1), self.hidden, dtype=x.dtype)
        outs: List[torch.Tensor] = []
        for t in range(x.size(0)):
            h, c = self.cell(x[t], (h, c))
            outs.append(h)
        return self.out(torch.stack(outs).mean(0)), (h, c)


class BranchyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)
        self.c = nn.Linear(32, 8)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if bool(h.sum() > 0):
            return self.b(h)
        else:
            return self.c(h) * 2.0


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.encode(x) + x

    @torch.jit.export
    def encode(self, x):
        return self.norm(F.gelu(self.fc(x)))


class SubMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = Tower()
        self.head = nn.Linear(16, 4)

    def forward(self, x, scale: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
        z = self.tower.encode(x)
        return self.head(z) * scale, z

    @torch.jit.export
    def encode(self, x):
        return self.tower.encode(x).relu()


class TracedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.Sigmoid())

    def forward(self, x):
        return self.net(x)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    models = {
        "cnn": (ResNetish(), None, "float 8x3x64x64"),
        "encoder": (Encoder(), None, "long 8x64 in [0,1000); bool 8x64 padding mask"),
        "lstm": (LoopLSTM(), None, "float 12x4x32"),
        "branchy_mlp": (BranchyMLP(), None, "float 8x16"),
        "submethod": (SubMethod(), None, "float 8x16; optional float scale"),
        "traced_mlp": (TracedMLP(), torch.randn(32, 64), "float 32x64"),
    }
    for name, (model, example, inputs) in models.items():
        if name == "cnn":
            # Running statistics that are not the initial ones, so eval-mode BatchNorm matters.
            model.train()
            with torch.no_grad():
                for _ in range(3):
                    model(torch.randn(8, 3, 64, 64))
        model.eval()
        scripted = torch.jit.trace(model, example) if example is not None else torch.jit.script(model)
        path = os.path.join(out, name + ".pt")
        torch.jit.save(scripted, path)
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump({"inputs": inputs, "torch": torch.__version__}, f)
        print("wrote", path)


if __name__ == "__main__":
    main()
