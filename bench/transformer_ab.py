"""Two builds of qrt on all-MiniLM-L6-v2 (bench_transformer.py's model and token windows), qrt alone: each
build runs in its own process, the builds alternating round by round so that both see the same machine load;
within a process the samples of every case and thread count interleave.

    python bench/transformer_ab.py --build main=/work/main --build branch=. --threads 1 2 --rounds 5

A build is a checkout with its extension built in place (make build); both run the .qrt file this checkout's
examples/semantic_search.py caches (build it first with bench_transformer.py or the example). Figures:
medians over the rounds of each round's median time per call.
"""

from __future__ import annotations

import os
import sys

from harness import ab_builds, round_median

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [("batch 1 x 16 tokens", 1, 16), ("batch 1 x 57 tokens", 1, 57), ("batch 1 x 100 tokens", 1, 100),
         ("batch 1 x 108 tokens", 1, 108), ("batch 1 x 128 tokens", 1, 128)]


def one_round(threads: list[int]) -> dict:
    """In the build on sys.path: {case: {threads: seconds}}."""
    import qrt  # the build's, before examples/common.py puts this checkout first on sys.path

    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import semantic_search as ss
    from bench_transformer import token_windows
    from harness import time_by_threads

    model = qrt.load(os.path.join(ss.CACHE, ss.QRT_NAME))
    tok = ss.tokenizer()
    entries = []
    for name, batch, tokens in CASES:
        ids, mask = token_windows(tok, batch, tokens)
        entries += [(name, n, lambda ids=ids, mask=mask: model.run((ids, mask)), lambda n=n: qrt.set_num_threads(n))
                    for n in threads]
    return time_by_threads(entries, min_time=0.05, repeats=9)


def main() -> None:
    result = ab_builds(__file__, __doc__, [1, 2], one_round)
    if result is None:
        return
    args, runs = result
    load = os.getloadavg()[0]
    print(f"{'case':24s}{'threads':>8s}" + "".join(f"{name:>12s}" for name in runs) + "  (ms, medians)")
    for case, *_ in CASES:
        for n in map(str, args.threads):
            cells = [round_median(rounds, case, n) * 1e3 for rounds in runs.values()]
            print(f"{case:24s}{n:>8s}" + "".join(f"{c:12.3f}" for c in cells))
    print(f"load average (1 min) at the end: {load:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
