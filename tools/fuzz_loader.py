"""Long fuzz run of the .qrt loader: hostile files must load and run, or raise qrt.FormatError.

    nice -n 19 python tools/fuzz_loader.py --cases 100000 --seed 1
    python tools/fuzz_loader.py --atheris -- -max_total_time=600   # coverage-guided, if atheris is installed

The generators are shared with tests/test_fuzz_loader.py (tests/fuzz_cases.py):
each case is a valid model of some op, mutated one to three times (byte
flips, truncations, insertions, header and graph edits). A case fails when
loading or running raises anything but FormatError (or a documented run-time
ValueError), or takes longer than --case-timeout seconds. Failing files are
saved under --out with their case number, so `--cases 1 --seed S --first N`
replays one.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
fuzz_cases = None  # imported in main(): atheris must instrument qrt before anything imports it


def _import_cases(instrument: bool) -> None:
    global fuzz_cases
    if instrument:
        import atheris

        with atheris.instrument_imports(include=["qrt"]):
            import qrt  # noqa: F401
    import fuzz_cases as module

    fuzz_cases = module


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def case_rng(seed: int, i: int) -> random.Random:
    """The generator of case i of a run: every case is replayable on its own."""
    return random.Random(seed * 1_000_003 + i)


def run(cases: int, seed: int, first: int, out: Path, case_timeout: float) -> int:
    fuzz_cases.seed_files()  # build the seed models before timing
    outcomes: collections.Counter = collections.Counter()
    failures: list[tuple[int, str, str]] = []
    signal.signal(signal.SIGALRM, _alarm)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "case.qrt")
        start = last = time.perf_counter()
        for i in range(first, first + cases):
            rnd = case_rng(seed, i)
            desc, data = fuzz_cases.make_case(rnd)
            signal.setitimer(signal.ITIMER_REAL, case_timeout)
            try:
                outcomes[fuzz_cases.check_case(data, path, rnd)] += 1
            except (AssertionError, Hang) as e:
                msg = "hang" if isinstance(e, Hang) else str(e)
                failures.append((i, desc, msg))
                out.mkdir(parents=True, exist_ok=True)
                (out / f"seed{seed}-case{i}.qrt").write_bytes(data)
                print(f"FAIL case {i} ({desc}): {msg[:300]}", flush=True)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            now = time.perf_counter()
            if now - last > 30:
                done = i - first + 1
                print(f"  {done} cases, {done / (now - start):.0f}/s, {len(failures)} failures", flush=True)
                last = now
        elapsed = time.perf_counter() - start
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{cases} cases in {elapsed:.1f} s ({cases / elapsed:.0f} cases/s), seed {seed}, peak RSS {rss_mib:.0f} MiB")
    for outcome, n in outcomes.most_common():
        print(f"  {n:8d}  {outcome}")
    print(f"  {len(failures):8d}  failures" + (f" (files in {out})" if failures else ""))
    kinds = collections.Counter(msg.split(":", 1)[0] for _, _, msg in failures)
    for kind, n in kinds.most_common():
        print(f"    {n:6d}  {kind}")
    return 1 if failures else 0


def run_atheris(argv: list[str]) -> int:
    """Coverage-guided: libFuzzer mutates raw bytes, starting from a corpus of the seed files."""
    import atheris

    corpus = Path(tempfile.mkdtemp(prefix="qrt-corpus-"))
    for name, data in fuzz_cases.seed_files().items():
        (corpus / f"{name}.qrt").write_bytes(data)
    rnd = random.Random(0)
    for i in range(200):  # structured cases reach deeper than byte mutations alone
        (corpus / f"case{i}.qrt").write_bytes(fuzz_cases.make_case(rnd)[1])
    path = os.path.join(tempfile.mkdtemp(prefix="qrt-atheris-"), "case.qrt")

    def one(data: bytes) -> None:
        fuzz_cases.check_case(data, path, random.Random(len(data)))  # AssertionError: atheris reports it

    atheris.Setup([sys.argv[0], *argv, str(corpus)], one)
    atheris.Fuzz()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--first", type=int, default=0, help="number of the first case (to replay one)")
    ap.add_argument("--out", type=Path, default=Path("fuzz-failures"), help="where failing files go")
    ap.add_argument("--case-timeout", type=float, default=10.0, help="seconds before a case counts as a hang")
    ap.add_argument("--atheris", action="store_true", help="coverage-guided fuzzing with atheris instead")
    args, rest = ap.parse_known_args()
    _import_cases(instrument=args.atheris)
    if args.atheris:
        return run_atheris([a for a in rest if a != "--"])
    return run(args.cases, args.seed, args.first, args.out, args.case_timeout)


if __name__ == "__main__":
    sys.exit(main())
