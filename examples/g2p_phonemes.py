"""A real trained model from PyPI: g2p_en's grapheme-to-phoneme GRU, quantized and run by qrt.

    PYTHONPATH=. .venv/bin/python examples/g2p_phonemes.py

The g2p_en package (pip install g2p_en) ships the weights of a trained GRU encoder-decoder
(g2p_en/checkpoint20.npz) that spells out English words it has no dictionary entry for. g2p_en runs
it in numpy; here the same weights go into PyTorch modules (an Embedding + GRU encoder, and an
Embedding + GRUCell + Linear decoder step), are converted to int8 .qrt files, and qrt decodes words
greedily, one decoder call per phoneme. Only the weight file is read: g2p_en itself is not
imported (it would download NLTK data).
"""

from __future__ import annotations

import importlib.util
import os

import common
import numpy as np
import torch
from common import convert, latency, max_abs_diff, quantize_dynamic, report
from torch import nn

GRAPHEMES = ["<pad>", "<unk>", "</s>", *"abcdefghijklmnopqrstuvwxyz"]
PHONEMES = ["<pad>", "<unk>", "<s>", "</s>"] + (
    "AA0 AA1 AA2 AE0 AE1 AE2 AH0 AH1 AH2 AO0 AO1 AO2 AW0 AW1 AW2 AY0 AY1 AY2 B CH D DH EH0 EH1 EH2 ER0 ER1 "
    "ER2 EY0 EY1 EY2 F G HH IH0 IH1 IH2 IY0 IY1 IY2 JH K L M N NG OW0 OW1 OW2 OY0 OY1 OY2 P R S SH T TH UH0 "
    "UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH"
).split()
START, END, HIDDEN, MAX_PHONEMES = 2, 3, 256, 20
WORDS = ["quantization", "activationist", "runtime", "kyubyong", "tensorflow", "overparameterized"]


def checkpoint() -> dict[str, np.ndarray]:
    """g2p_en's trained weights, found without importing the package."""
    spec = importlib.util.find_spec("g2p_en")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("g2p_en is not installed: pip install g2p_en (it is in requirements-dev.txt)")
    with np.load(os.path.join(spec.submodule_search_locations[0], "checkpoint20.npz")) as f:
        return {k: f[k] for k in f.files}


class Encoder(nn.Module):
    """Graphemes [batch, letters] -> the GRU's last output [batch, HIDDEN]."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(len(GRAPHEMES), HIDDEN)
        self.gru = nn.GRU(HIDDEN, HIDDEN, batch_first=True)

    def forward(self, letters: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.emb(letters))
        return out[:, -1]


class DecoderStep(nn.Module):
    """One decoding step: the previous phoneme [batch] and the state -> next-phoneme logits, new state."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(len(PHONEMES), HIDDEN)
        self.cell = nn.GRUCell(HIDDEN, HIDDEN)
        self.fc = nn.Linear(HIDDEN, len(PHONEMES))

    def forward(self, phoneme: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.cell(self.emb(phoneme), h)
        return self.fc(h), h


def _set(param: nn.Parameter, value: np.ndarray) -> None:
    with torch.no_grad():
        param.copy_(torch.from_numpy(value))


def make_encoder() -> Encoder:
    """The converter's factory: `--model g2p_phonemes:make_encoder` (weights from its state_dict)."""
    return Encoder()


def make_decoder() -> DecoderStep:
    return DecoderStep()


def trained() -> tuple[Encoder, DecoderStep]:
    """The two modules holding g2p_en's weights (its GRU gates are torch's: r, z, n)."""
    w = checkpoint()
    enc, dec = Encoder(), DecoderStep()
    _set(enc.emb.weight, w["enc_emb"])
    for side in ("ih", "hh"):
        _set(getattr(enc.gru, f"weight_{side}_l0"), w[f"enc_w_{side}"])
        _set(getattr(enc.gru, f"bias_{side}_l0"), w[f"enc_b_{side}"])
        _set(getattr(dec.cell, f"weight_{side}"), w[f"dec_w_{side}"])
        _set(getattr(dec.cell, f"bias_{side}"), w[f"dec_b_{side}"])
    _set(dec.emb.weight, w["dec_emb"])
    _set(dec.fc.weight, w["fc_w"])
    _set(dec.fc.bias, w["fc_b"])
    return enc.eval(), dec.eval()


def letters(word: str) -> np.ndarray:
    return np.array([[GRAPHEMES.index(c) for c in word] + [GRAPHEMES.index("</s>")]], np.int64)


def decode(encode, step, word: str) -> tuple[list[str], list[np.ndarray]]:
    """Greedy decoding as g2p_en does it; encode/step take and return numpy arrays."""
    h = encode(letters(word))
    phoneme, out, logits_seen = np.array([START]), [], []
    for _ in range(MAX_PHONEMES):
        logits, h = step(phoneme, h)
        logits_seen.append(logits)
        phoneme = logits.argmax(1)
        if phoneme[0] == END:
            break
        out.append(PHONEMES[phoneme[0]])
    return out, logits_seen


def run_example(out_dir: str, quiet: bool = False) -> dict:

    enc, dec = trained()
    enc_path = convert(enc, "g2p_phonemes:make_encoder", out_dir, "--input-shape", "1,8")
    dec_path = convert(dec, "g2p_phonemes:make_decoder", out_dir, "--input-shape", "1", "--input-shape", f"1,{HIDDEN}")
    q_enc, q_dec = common.load(enc_path), common.load(dec_path)
    t_enc, t_dec = quantize_dynamic(enc), quantize_dynamic(dec)

    def torch_fn(module):
        def call(*arrays):
            with torch.no_grad():
                out = module(*(torch.from_numpy(a) for a in arrays))
            return out.numpy() if isinstance(out, torch.Tensor) else tuple(o.numpy() for o in out)

        return call

    figures, lines = {}, [f"{q_enc}", f"{q_dec}"]
    for word in WORDS:
        got, got_logits = decode(q_enc.run, lambda p, h: q_dec.run((p, h)), word)
        want, want_logits = decode(torch_fn(t_enc), torch_fn(t_dec), word)
        as_float, _ = decode(torch_fn(enc), torch_fn(dec), word)
        # the encoder alone, and the first decoder step (both sides from the same start)
        enc_diff = max_abs_diff(q_enc.run(letters(word)), torch_fn(t_enc)(letters(word)))
        figures[word] = {"same_phonemes": got == want, "same_as_float": got == as_float,
                         "encoder_max_abs_diff": enc_diff,
                         "first_step_max_abs_diff": max_abs_diff(got_logits[0], want_logits[0])}
        lines.append(f"{word:>18}: qrt {' '.join(got)}")
        if got != want:
            lines.append(f"{'':>18}  PyTorch int8 {' '.join(want)}")
    if not quiet:
        h = q_enc.run(letters("runtime"))
        start, ht = np.array([START]), torch.from_numpy(h)
        lines.append(latency("one decoder step, batch 1", lambda: q_dec.run((start, h)),
                             lambda: t_dec(torch.from_numpy(start), ht)))
        report("g2p_en's trained GRU encoder-decoder (dynamic int8)", lines)
    return figures


if __name__ == "__main__":
    common.main(run_example)
