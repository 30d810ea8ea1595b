"""How many of qrt's attention outputs are bit-equal to torch's scaled_dot_product_attention, at BERT shapes.

12 heads, E = 32, L = S in {8, 16, 37, 128}, batch 1 and 4, with no mask and with HuggingFace's padding masks
(bool [B, 1, S, S], and float32 0 / finfo.min), against torch's default CPU capability and
ATEN_CPU_CAPABILITY=avx2 (each in a child process, since torch reads it at start), for every qrt kernel variant
this CPU runs (docs/NUMERICS.md section 12 quotes the result).

    python bench/attention_bits.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np

HEADS, E = 12, 32
CAPABILITIES = ("default", "avx2")


def cases() -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
    rng = np.random.default_rng(5)
    out = []
    for s in (8, 16, 37, 128):
        for batch in (1, 4):
            lengths = [s, max(1, s - 3), max(1, s // 2), max(1, s // 3)][:batch]
            keep = np.zeros((batch, 1, s, s), bool)
            for b, n in enumerate(lengths):
                keep[b, 0, :, :n] = True
            for kind in ("none", "bool", "float"):
                q, k, v = (rng.standard_normal((batch, HEADS, s, E)).astype(np.float32) * sd for sd in (1.5, 1.5, 1))
                mask = {"none": None, "bool": keep, "float": np.where(keep, np.float32(0), np.finfo(np.float32).min)}
                out.append((f"S={s} B={batch} {kind}", q, k, v, mask[kind]))
    return out


def torch_outputs(path: str) -> None:
    import torch

    outs = {}
    for name, q, k, v, mask in cases():
        m = None if mask is None else torch.from_numpy(mask)
        qkv = (torch.from_numpy(a) for a in (q, k, v))
        outs[name] = torch.nn.functional.scaled_dot_product_attention(*qkv, attn_mask=m).numpy()
    np.savez(path, **outs)


def qrt_output(tmp: str, q, k, v, mask) -> np.ndarray:
    import qrt
    from qrt.builder import GraphBuilder

    b = GraphBuilder()
    feeds = {"q": q, "k": k, "v": v} | ({} if mask is None else {"mask": mask})
    b.output(b.node("attention", {p: b.input(p, a.dtype.name, [None] * a.ndim) for p, a in feeds.items()}, {}))
    path = os.path.join(tmp, "attention.qrt")
    b.save(path)
    return qrt.load(path).run(feeds)


def main() -> None:
    from qrt import _kernels as K

    with tempfile.TemporaryDirectory() as tmp:
        for cap in CAPABILITIES:
            env = dict(os.environ) | ({"ATEN_CPU_CAPABILITY": cap} if cap != "default" else {})
            subprocess.run([sys.executable, __file__, "--torch", os.path.join(tmp, cap)], env=env, check=True)
        want = {cap: np.load(os.path.join(tmp, cap + ".npz")) for cap in CAPABILITIES}
        variants = [name for name, ok in K.kernel_variants().items() if ok]
        equal: dict[tuple[str, str], list[float]] = {}
        for name, q, k, v, mask in cases():
            for variant in variants:
                before = K._use_variant(variant)
                try:
                    got = qrt_output(tmp, q, k, v, mask).view(np.int32)
                finally:
                    K._use_variant(before)
                for cap in CAPABILITIES:
                    equal.setdefault((variant, cap), []).append(float((got == want[cap][name].view(np.int32)).mean()))
            torch_self = (want["default"][name].view(np.int32) == want["avx2"][name].view(np.int32)).mean()
            line = "  ".join(f"{cap} {equal[(variants[0], cap)][-1]:.4f}" for cap in CAPABILITIES)
            print(f"{name:18s} qrt {variants[0]} vs torch {line}   torch default vs avx2 {torch_self:.4f}")
        for (variant, cap), fractions in equal.items():
            print(f"qrt {variant:12s} vs torch {cap:8s}: bit-equal mean {np.mean(fractions):.4f}, "
                  f"min {np.min(fractions):.4f} over {len(fractions)} cases")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torch"]:
        torch_outputs(sys.argv[2])
    else:
        main()
