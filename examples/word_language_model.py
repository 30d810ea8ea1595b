"""PyTorch's word-level language model (examples/word_language_model), quantized and run by qrt.

    PYTHONPATH=. .venv/bin/python examples/word_language_model.py

The model is PyTorch's `RNNModel` with an LSTM, as that example writes it: an Embedding encoder,
a 2-layer LSTM taking and returning `hidden = (h, c)`, a Linear decoder, `view(-1, ntoken)` and
`log_softmax`. It is trained briefly on the Zen of Python, quantized with PyTorch's own
`quantize_dynamic` (int8 LSTM and Linear, 8-bit weight-only Embedding), saved whole, and converted
with `--trust-checkpoint`. qrt then generates text from it, carrying the (h, c) state between calls.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os

import common
import numpy as np
import torch
import torch.nn.functional as F
from common import largest_row_sum, latency, max_abs_diff, report
from torch import nn
from torch.ao.quantization import default_dynamic_qconfig, float_qparams_weight_only_qconfig, quantize_dynamic

EMBED, HIDDEN, LAYERS = 64, 64, 2


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder (PyTorch's example, LSTM)."""

    def __init__(self, ntoken: int, ninp: int = EMBED, nhid: int = HIDDEN, nlayers: int = LAYERS, dropout: float = 0.2):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]):  # input [seq, batch]
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(self.nlayers, bsz, self.nhid), torch.zeros(self.nlayers, bsz, self.nhid))


def corpus() -> tuple[list[str], dict[str, int]]:
    """The Zen of Python, as words: a corpus every Python has."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    words = codecs.decode(this.s, "rot13").lower().replace("\n", " <eos> ").split()
    return words, {w: i for i, w in enumerate(sorted(set(words)))}


def train(model: RNNModel, ids: torch.Tensor, steps: int = 60, bptt: int = 20) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - bptt - 1, (16,), generator=g)
        x = torch.stack([ids[s : s + bptt] for s in starts], 1)
        y = torch.stack([ids[s + 1 : s + bptt + 1] for s in starts], 1)
        opt.zero_grad()
        out, _ = model(x, model.init_hidden(16))
        F.nll_loss(out, y.reshape(-1)).backward()
        opt.step()
    model.eval()


def quantize(model: RNNModel) -> nn.Module:
    """PyTorch's own dynamic quantization, 8-bit rows for the embedding table."""
    spec = {
        nn.Embedding: float_qparams_weight_only_qconfig,
        nn.LSTM: default_dynamic_qconfig,
        nn.Linear: default_dynamic_qconfig,
    }
    return quantize_dynamic(model, spec, dtype=torch.qint8)


def build(out_dir: str) -> tuple[RNNModel, nn.Module, str, torch.Tensor, dict[str, int]]:
    """Train, quantize with PyTorch, save whole and convert: the float model, PyTorch's quantized
    model, the .qrt file's path, the corpus as token ids and the vocabulary."""
    from tools import convert as qconvert

    torch.manual_seed(0)
    words, vocab = corpus()
    ids = torch.tensor([vocab[w] for w in words])
    model = RNNModel(len(vocab))
    train(model, ids)
    reference = quantize(model)
    ckpt, path = os.path.join(out_dir, "word_lm.pt"), os.path.join(out_dir, "word_lm.qrt")
    torch.save(reference, ckpt)  # saved whole, as quantized models usually are
    hidden_shape = f"({LAYERS},1,{HIDDEN})"
    status = qconvert.main([ckpt, "-o", path, "--trust-checkpoint", "--quiet", "--input-shape", "35,1",
                            "--input-shape", f"{hidden_shape},{hidden_shape}"])
    if status != 0:
        raise SystemExit(f"converting the word language model failed (status {status})")
    return model, reference, path, ids, vocab


def run_example(out_dir: str, quiet: bool = False, generate: int = 30) -> dict:

    model, reference, path, ids, vocab = build(out_dir)
    qmodel = common.load(path)

    figures = {"head_row_sum": largest_row_sum(model.decoder)}
    for seq, batch in ((35, 1), (20, 4), (1, 1)):  # sequence length and batch are both free
        x = torch.stack([ids[7 * b : 7 * b + seq] for b in range(batch)], 1)
        hidden = reference.init_hidden(batch)
        got = qmodel.run((x.numpy(), tuple(h.numpy() for h in hidden)))
        with torch.no_grad():
            want_out, (want_h, want_c) = reference(x, hidden)
        figures[(seq, batch)] = max_abs_diff(got, (want_out.numpy(), (want_h.numpy(), want_c.numpy())))

    # Greedy generation, one word per call, the state carried from call to call on each side.
    inv = {i: w for w, i in vocab.items()}
    token = np.array([[vocab["beautiful"]]])
    state = tuple(h.numpy() for h in reference.init_hidden(1))
    state_torch = reference.init_hidden(1)
    text_qrt, text_torch = [], []
    token_torch = torch.from_numpy(token)
    for _ in range(generate):
        out, state = qmodel.run((token, state))
        token = out.argmax(1).reshape(1, 1)
        text_qrt.append(inv[int(token[0, 0])])
        with torch.no_grad():
            out_t, state_torch = reference(token_torch, state_torch)
        token_torch = out_t.argmax(1).reshape(1, 1)
        text_torch.append(inv[int(token_torch[0, 0])])
    figures["same_words"] = sum(a == b for a, b in zip(text_qrt, text_torch)) / generate

    if not quiet:
        lines = [f"{qmodel}"]
        lines += [f"seq {s}, batch {b}: log-probs and (h, c) within {figures[(s, b)]:.2g} of PyTorch's"
                  for s, b in ((35, 1), (20, 4), (1, 1))]
        lines.append("qrt generates:     beautiful " + " ".join(text_qrt).replace("<eos>", "/"))
        lines.append("PyTorch generates: beautiful " + " ".join(text_torch).replace("<eos>", "/"))
        one = (token, state)
        lines.append(latency("one word, batch 1", lambda: qmodel.run(one), lambda: reference(token_torch, state_torch)))
        report("word-level LSTM language model (int8 LSTM and decoder, 8-bit embedding)", lines)
    return figures


if __name__ == "__main__":
    import word_language_model  # pickled under its module name, so the converter can import the class

    common.main(word_language_model.run_example)
