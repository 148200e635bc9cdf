"""Exercise 18 (interleaved rounds, the verdict, the quantity): realistic mistakes fail a named check, correct
alternatives pass. Judged exactly as the grader judges (observe -> save -> load -> replay), see
tests/test_grading_variants.py.
"""

from __future__ import annotations

# (what the mistake is, the code, a word from the name of the check that must fail)
WRONG = [
    ("no warm-up", """
        def interleaved_rounds(a, b, rounds, clock):
            a_times, b_times = [], []
            for i in range(rounds):
                for fn, times in ([(a, a_times), (b, b_times)] if i % 2 == 0 else [(b, b_times), (a, a_times)]):
                    start = clock(); fn(); times.append(clock() - start)
            return a_times, b_times
        """, "alternating order"),
    ("no warm-up: the slow first call is timed", """
        def interleaved_rounds(a, b, rounds, clock):
            a_times, b_times = [], []
            for i in range(rounds):
                for fn, times in ([(a, a_times), (b, b_times)] if i % 2 == 0 else [(b, b_times), (a, a_times)]):
                    start = clock(); fn(); times.append(clock() - start)
            return a_times, b_times
        """, "clock given"),
    ("all of a, then all of b", """
        def interleaved_rounds(a, b, rounds, clock):
            a(); b()
            out = []
            for fn in (a, b):
                times = []
                for _ in range(rounds):
                    start = clock(); fn(); times.append(clock() - start)
                out.append(times)
            return out[0], out[1]
        """, "alternating order"),
    ("time.perf_counter instead of the clock given", """
        def interleaved_rounds(a, b, rounds, clock):
            a(); b()
            a_times, b_times = [], []
            for i in range(rounds):
                for fn, times in ([(a, a_times), (b, b_times)] if i % 2 == 0 else [(b, b_times), (a, a_times)]):
                    start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
            return a_times, b_times
        """, "clock given"),
    ("one timer around the whole round", """
        def interleaved_rounds(a, b, rounds, clock):
            a(); b()
            a_times, b_times = [], []
            for i in range(rounds):
                start = clock()
                (a() or b()) if i % 2 == 0 else (b() or a())
                a_times.append((clock() - start) / 2); b_times.append((clock() - start) / 2)
            return a_times, b_times
        """, "clock given"),
    ("means instead of medians (a hiccup decides)", """
        def verdict(a_times, b_times, band=0.05):
            ratio = statistics.mean(b_times) / statistics.mean(a_times)
            if len(a_times) < 3:
                return "too_close", ratio
            paired = [tb / ta for ta, tb in zip(a_times, b_times)]
            low, _, high = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) >= 4 else \\
                (min(paired), 0, max(paired))
            if ratio >= 1 + band and low > 1:
                return "faster", ratio
            if ratio <= 1 / (1 + band) and high < 1:
                return "slower", ratio
            return "too_close", ratio
        """, "ratio of the medians"),
    ("the median of the per-round ratios", """
        def verdict(a_times, b_times, band=0.05):
            paired = [tb / ta for ta, tb in zip(a_times, b_times)]
            ratio = statistics.median(paired)
            if len(a_times) < 3:
                return "too_close", ratio
            low, _, high = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) >= 4 else \\
                (min(paired), 0, max(paired))
            if ratio >= 1 + band and low > 1:
                return "faster", ratio
            if ratio <= 1 / (1 + band) and high < 1:
                return "slower", ratio
            return "too_close", ratio
        """, "ratio of the medians"),
    ("the ratio upside down (a over b)", """
        def verdict(a_times, b_times, band=0.05):
            ratio = statistics.median(a_times) / statistics.median(b_times)
            if len(a_times) < 3:
                return "too_close", ratio
            if ratio >= 1 + band:
                return "faster", ratio
            if ratio <= 1 / (1 + band):
                return "slower", ratio
            return "too_close", ratio
        """, "ratio of the medians"),
    ("decided on the ratio alone (the rounds' agreement ignored)", """
        def verdict(a_times, b_times, band=0.05):
            ratio = statistics.median(b_times) / statistics.median(a_times)
            if len(a_times) < 3:
                return "too_close", ratio
            if ratio >= 1 + band:
                return "faster", ratio
            if ratio <= 1 / (1 + band):
                return "slower", ratio
            return "too_close", ratio
        """, "rounds agree"),
    ("the band ignored", """
        def verdict(a_times, b_times, band=0.05):
            ratio = statistics.median(b_times) / statistics.median(a_times)
            if len(a_times) < 3:
                return "too_close", ratio
            paired = [tb / ta for ta, tb in zip(a_times, b_times)]
            low, _, high = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) >= 4 else \\
                (min(paired), 0, max(paired))
            if low > 1:
                return "faster", ratio
            if high < 1:
                return "slower", ratio
            return "too_close", ratio
        """, "rounds agree"),
    ("a fixed 5% band whatever band= says", """
        def verdict(a_times, b_times, band=0.05):
            band = 0.05
            ratio = statistics.median(b_times) / statistics.median(a_times)
            if len(a_times) < 3:
                return "too_close", ratio
            paired = [tb / ta for ta, tb in zip(a_times, b_times)]
            low, _, high = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) >= 4 else \\
                (min(paired), 0, max(paired))
            if ratio >= 1 + band and low > 1:
                return "faster", ratio
            if ratio <= 1 / (1 + band) and high < 1:
                return "slower", ratio
            return "too_close", ratio
        """, "rounds agree"),
    ("two rounds decided", """
        def verdict(a_times, b_times, band=0.05):
            ratio = statistics.median(b_times) / statistics.median(a_times)
            paired = [tb / ta for ta, tb in zip(a_times, b_times)]
            low, _, high = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) >= 4 else \\
                (min(paired), 0, max(paired))
            if ratio >= 1 + band and low > 1:
                return "faster", ratio
            if ratio <= 1 / (1 + band) and high < 1:
                return "slower", ratio
            return "too_close", ratio
        """, "fewer than"),
    ("CPU time for parallel comparisons too", """
        def quantity(kind, others_cores, device="cpu"):
            return "cpu" if device == "cpu" and others_cores >= 0.5 else "wall"
        """, "quantity"),
    ("CPU time on a GPU too", """
        def quantity(kind, others_cores, device="cpu"):
            return "cpu" if kind == "work" and others_cores >= 0.5 else "wall"
        """, "quantity"),
    ("CPU time only above the threshold (0.5 itself is contended)", """
        def quantity(kind, others_cores, device="cpu"):
            return "cpu" if kind == "work" and device == "cpu" and others_cores > 0.5 else "wall"
        """, "quantity"),
]

RIGHT = [
    ("rounds with an index list and a dict of times; medians by sorting", """
        def interleaved_rounds(a, b, rounds, clock):
            fns = {"a": a, "b": b}
            for name in "ab":
                fns[name]()
            times = {"a": [], "b": []}
            for i in range(rounds):
                for name in ("ab" if i % 2 == 0 else "ba"):
                    t0 = clock()
                    fns[name]()
                    t1 = clock()
                    times[name].append(t1 - t0)
            return times["a"], times["b"]

        def _median(xs):
            s = sorted(xs)
            n = len(s)
            return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

        def verdict(a_times, b_times, band=0.05):
            ratio = _median(b_times) / _median(a_times)
            if len(a_times) < 3:
                return ("too_close", ratio)
            r = sorted(b / a for a, b in zip(a_times, b_times))
            if len(r) >= 4:
                q = statistics.quantiles(r, n=4, method="inclusive")
                low, high = q[0], q[2]
            else:
                low, high = r[0], r[-1]
            outcome = "too_close"
            if ratio >= 1 + band and low > 1:
                outcome = "faster"
            elif ratio <= 1 / (1 + band) and high < 1:
                outcome = "slower"
            return (outcome, ratio)
        """),
    ("numpy medians and percentiles; a list returned", """
        import numpy as np

        def verdict(a_times, b_times, band=0.05):
            ratio = float(np.median(b_times) / np.median(a_times))
            if len(a_times) < 3:
                return ["too_close", ratio]
            r = np.array(b_times) / np.array(a_times)
            low, high = (np.percentile(r, 25), np.percentile(r, 75)) if len(r) >= 4 else (r.min(), r.max())
            if ratio >= 1 + band and low > 1:
                return ["faster", ratio]
            if ratio <= 1 / (1 + band) and high < 1:
                return ["slower", ratio]
            return ["too_close", ratio]

        def quantity(kind, others_cores, device="cpu"):
            if kind == "parallel" or device != "cpu":
                return "wall"
            return "cpu" if others_cores >= 0.5 else "wall"
        """),
]
