"""Helpers shared by the op-level tests: torch quantized weights -> qrt node inputs."""

from __future__ import annotations

import numpy as np
import torch


def qparams(q: torch.Tensor, prefix: str = "") -> dict[str, np.ndarray]:
    """scale / zero_point node inputs for a quantized torch tensor, per-tensor or per-channel."""
    if q.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        scale = q.q_per_channel_scales().numpy().astype(np.float32)
        zp = q.q_per_channel_zero_points().numpy().astype(np.int32)
        # torch keeps scales in double; qrt stores float32, which must be exact for these models
        assert np.array_equal(scale.astype(np.float64), q.q_per_channel_scales().numpy())
    else:
        scale = np.asarray(q.q_scale(), np.float32)
        zp = np.asarray(q.q_zero_point(), np.int32)
        assert float(scale) == q.q_scale()
    return {f"{prefix}scale": scale, f"{prefix}zero_point": zp}


def dynamic_weight(weight: torch.Tensor, bias: torch.Tensor | None, prefix: str = "") -> dict[str, np.ndarray]:
    """The weight ports of a dynamic linear from a torch qint8 weight or an unpacked float16 one."""
    if not weight.is_quantized:  # float16 packed weights unpack as float32 holding float16 values
        w16 = weight.detach().numpy().astype(np.float16)
        assert np.array_equal(w16.astype(np.float32), weight.detach().numpy())
        ports = {f"{prefix}weight": w16}
    else:
        ports = {f"{prefix}weight": weight.int_repr().numpy(), **qparams(weight, f"{prefix}weight_")}
    if bias is not None:
        ports[f"{prefix}bias"] = bias.detach().numpy().astype(np.float32)
    return ports


def quantized_copy(module: torch.nn.Module, dtype: torch.dtype, per_channel: bool) -> torch.nn.Module:
    """torch's dynamic quantization of one float module (qint8 or float16 weights)."""
    if dtype == torch.float16:
        qconfig = torch.ao.quantization.float16_dynamic_qconfig
    elif per_channel:
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    else:
        qconfig = torch.ao.quantization.default_dynamic_qconfig
    wrapped = torch.nn.Sequential(module)
    return torch.ao.quantization.quantize_dynamic(wrapped, {type(module): qconfig}, dtype=dtype)[0]


def dynamic_linear_file(path, qlinear, in_features: int, engine: str | None = None) -> None:
    """Write a one-node linear_dynamic model (reduce_range, as torch's x86 engine) of a torch dynamic quantized
    Linear: input x; engine: the node's attribute engine, if given."""
    from qrt.builder import GraphBuilder

    g = GraphBuilder()
    x = g.input("x", "float32", [None, in_features])
    attrs = {"reduce_range": True, **({} if engine is None else {"engine": engine})}
    g.output(g.node("linear_dynamic", {"x": x, **dynamic_weight(qlinear.weight(), qlinear.bias())}, attrs))
    g.save(path)


def cell_model_file(path, kind: str, qcell, engine: str | None = None) -> None:
    """Write a one-node cell model of a torch dynamic quantized cell: inputs x, h (, c). kind: lstm, gru,
    rnn_tanh or rnn_relu; engine: the node's attribute engine, if given."""
    from qrt.builder import GraphBuilder

    wb = qcell._weight_bias()
    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [None, qcell.input_size]),
             "h": g.input("h", "float32", [None, qcell.hidden_size])}
    if kind == "lstm":
        ports["c"] = g.input("c", "float32", [None, qcell.hidden_size])
    for side in ("ih", "hh"):
        ports.update(dynamic_weight(wb["weight"][f"weight_{side}"], wb["bias"][f"bias_{side}"], f"{side}_"))
    attrs = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    if engine is not None:
        attrs["engine"] = engine
    out = g.node(f"{kind[:3] if kind.startswith('rnn') else kind}_cell_dynamic", ports, attrs, name="cell")
    g.output(*(out if isinstance(out, tuple) else (out,)), as_tuple=kind == "lstm")
    g.save(path)


def convert_both_ways(tmp_path, factory: str, shapes: list[str], option: str, ways: tuple[str, str],
                      **kwargs) -> tuple[bytes, bytes]:
    """The files tools.convert writes for one checkpoint of factory ("module:function") with option (frontend,
    quantizer) set each of two ways, in that order; each result must say it took its way."""
    from tools.convert import convert

    module, _, name = factory.partition(":")
    ckpt = str(tmp_path / "model.pt")
    torch.save(getattr(__import__(module), name)().state_dict(), ckpt)
    out = []
    for way in ways:
        path = tmp_path / f"{way}.qrt"
        result = convert(ckpt, path, model=factory, input_shapes=shapes, **{option: way}, **kwargs)
        assert getattr(result, option) == way
        out.append(path.read_bytes())
    return out[0], out[1]
