"""Recurrent models whose forward() takes and returns nested tuples, for tests/test_compare.py.

Each has a flat twin with the same modules (so one state_dict fits both): the twin converts with
today's converter, and tests/test_compare.py groups its flat inputs and outputs into the nested
structure (format version 3) as the converter names them (argument `state` -> `state.0`, `state.1`).
"""

from __future__ import annotations

import torch
from models import StepLSTM
from torch import nn


class StateLSTMCell(StepLSTM):
    """A streaming LSTMCell step: forward(x, state) with state = (h, c) -> (y, (h', c'))."""

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        h, c = self.cell(x, state)
        return self.head(h), (h, c)


class LanguageModel(nn.Module):
    """The word-language-model shape over features: forward(x, hidden) with hidden = (h0, c0)
    -> (logits, (h_n, c_n)); x is [batch, time, 8]."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 6)

    def forward(self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        y, hidden = self.lstm(x, hidden)
        return self.head(y), hidden


class FlatLanguageModel(LanguageModel):
    """LanguageModel with its state flat: forward(x, h0, c0) -> (logits, h_n, c_n)."""

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> tuple:
        y, (h, c) = self.lstm(x, (h0, c0))
        return self.head(y), h, c


def make_state_lstm_cell() -> StateLSTMCell:
    torch.manual_seed(5)
    return StateLSTMCell()


def make_language_model() -> LanguageModel:
    torch.manual_seed(6)
    return LanguageModel()


def make_flat_language_model() -> FlatLanguageModel:
    torch.manual_seed(6)
    return FlatLanguageModel()
