"""Small float models for the converter tests, importable by factory name (models:make_mlp)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, n_in: int = 37, hidden: int = 48, n_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu1(self.fc1(x))
        h = torch.relu(self.fc2(h))
        return self.fc3(h)


class StepRNN(nn.Module):
    """One streaming step: forward(x, h) -> (y, h_next)."""

    def __init__(self, n_in: int = 12, hidden: int = 32, n_out: int = 5, nonlinearity: str = "tanh") -> None:
        super().__init__()
        self.cell = nn.RNNCell(n_in, hidden, nonlinearity=nonlinearity)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_next = self.cell(x, h)
        return self.head(h_next), h_next


class ConvNet(nn.Module):
    """Has a layer qrt does not run (Conv1d)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(4 * 14, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flat(self.conv(x)))


class SeqClassifier(nn.Module):
    """A recurrent classifier: sequence -> final hidden state -> Linear head; returns (logits, h_n).

    The head reads h_n whole ([layers * directions, batch, hidden]); LastStepClassifier indexes it.
    """

    def __init__(self, rnn: nn.RNNBase, n_out: int = 5) -> None:
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(rnn.hidden_size, n_out)
        self.is_lstm = isinstance(rnn, nn.LSTM)  # quantize_dynamic swaps self.rnn for a non-nn.LSTM

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_lstm:
            y, (h, c) = self.rnn(x)
        else:
            y, h = self.rnn(x)
        return self.head(h), h


class LastStepClassifier(SeqClassifier):
    """Reads h_n[-1]: tensor indexing (a select node)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, h = self.rnn(x)
        return self.head(h[-1])


class StepLSTM(nn.Module):
    """One streaming step: forward(x, h, c) -> (y, h_next, c_next)."""

    def __init__(self, n_in: int = 10, hidden: int = 20, n_out: int = 4) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(n_in, hidden)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h_next, c_next = self.cell(x, (h, c))
        return self.head(h_next), h_next, c_next


class StepGRU(nn.Module):
    """One streaming step: forward(x, h) -> (y, h_next)."""

    def __init__(self, n_in: int = 10, hidden: int = 20, n_out: int = 4) -> None:
        super().__init__()
        self.cell = nn.GRUCell(n_in, hidden)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_next = self.cell(x, h)
        return self.head(h_next), h_next


def make_mlp() -> MLP:
    torch.manual_seed(0)
    return MLP()


def make_step_rnn_tanh() -> StepRNN:
    torch.manual_seed(1)
    return StepRNN(nonlinearity="tanh")


def make_step_rnn_relu() -> StepRNN:
    torch.manual_seed(2)
    return StepRNN(nonlinearity="relu")


def make_convnet() -> ConvNet:
    return ConvNet()


def make_broken() -> MLP:
    raise RuntimeError("this factory always fails")


def make_mlp_wide() -> MLP:
    """Same layer names as make_mlp, different input width: a checkpoint of make_mlp does not fit."""
    return MLP(n_in=40)


def make_lstm_classifier() -> SeqClassifier:
    torch.manual_seed(3)
    return SeqClassifier(nn.LSTM(12, 24, batch_first=True))


def make_gru_classifier() -> SeqClassifier:
    """Sequence first, two layers, bidirectional."""
    torch.manual_seed(4)
    return SeqClassifier(nn.GRU(9, 16, num_layers=2, bidirectional=True))


def make_rnn_classifier() -> SeqClassifier:
    torch.manual_seed(5)
    return SeqClassifier(nn.RNN(9, 16, num_layers=2, nonlinearity="relu", bidirectional=True, batch_first=True))


def make_last_step_classifier() -> LastStepClassifier:
    torch.manual_seed(6)
    return LastStepClassifier(nn.GRU(9, 16))


def make_step_lstm() -> StepLSTM:
    torch.manual_seed(7)
    return StepLSTM()


def make_step_gru() -> StepGRU:
    torch.manual_seed(8)
    return StepGRU()


class TwiceLSTM(nn.Module):
    """One nn.LSTM called twice, the second time from the first call's state: (x), then (y, (h, c))."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.proj = nn.Linear(8, 6)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, (h, c) = self.lstm(x)
        y, _ = self.lstm(self.proj(y), (h, c))
        return self.head(y)


class TwiceCell(nn.Module):
    """One nn.LSTMCell stepped twice: two inputs, one state."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(5, 7)

    def forward(self, a: torch.Tensor, b: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple:
        return self.cell(b, self.cell(a, (h, c)))


def make_twice_lstm() -> TwiceLSTM:
    torch.manual_seed(9)
    return TwiceLSTM()


def make_twice_cell() -> TwiceCell:
    torch.manual_seed(10)
    return TwiceCell()
