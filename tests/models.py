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
