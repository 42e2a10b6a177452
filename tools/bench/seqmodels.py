"""The benchmark's recurrent sequence classifiers in PyTorch (needs torch): token ids [N, T] -> nn.Embedding ->
nn.LSTM / nn.GRU (batch_first) -> nn.Linear on the last step's output, like keyboard and keyword-spotting models.

The parent (tools/bench/prepare.py) builds one, exports it to ONNX and pickles that very module for the PyTorch
worker, so both start from the same weights by construction. The worker unpickles it with this folder on its path
(it is the worker script's own folder): pickle imports this module by name, and this module imports torch only."""

from __future__ import annotations

import torch

nn = torch.nn

VOCAB, EMBED, HIDDEN, CLASSES, SEQ_LEN = 1000, 64, 128, 10, 32
CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}


class SeqClassifier(nn.Module):
    """tokens [N, T] (int64) -> logits [N, CLASSES] from the last step's output of the recurrent stack."""

    def __init__(self, cell: str = "lstm", layers: int = 1, bidirectional: bool = False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMBED)
        self.rnn = CELLS[cell](
            EMBED, HIDDEN, num_layers=layers, bidirectional=bidirectional, batch_first=True
        )
        self.fc = nn.Linear(HIDDEN * (2 if bidirectional else 1), CLASSES)

    def forward(self, tokens):
        y, _ = self.rnn(self.emb(tokens))
        return self.fc(y[:, -1])


# configuration model name -> (cell, layers, bidirectional)
ARCHS = {"lstm": ("lstm", 1, False), "gru": ("gru", 1, False), "bilstm2": ("lstm", 2, True)}
HEAD = "fc"  # the classifier: head-only fine-tuning trains fc.weight and fc.bias


def build(model: str, seed: int = 0) -> SeqClassifier:
    """The classifier with torch's default initialization under a fixed seed, in eval mode (no dropout anyway)."""
    torch.manual_seed(seed)
    return SeqClassifier(*ARCHS[model]).eval()


def describe(model: str) -> str:
    cell, layers, bi = ARCHS[model]
    rnn = f"{'bidirectional ' if bi else ''}{cell.upper()}{f' x{layers} layers' if layers > 1 else ''}"
    return f"Embedding {VOCAB}x{EMBED} -> {rnn} {HIDDEN} -> Linear, T {SEQ_LEN}"
