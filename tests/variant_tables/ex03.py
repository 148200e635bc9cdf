"""Exercise 03: realistic wrong variants fail their named check, correct alternatives pass every check.

Judged like :mod:`test_grading_variants` (the grader's observe -> save -> load -> replay path). The graph-break
task is graded by ``torch._dynamo.explain`` on the learner's function (one graph, no break) and by its values on
inputs drawn from the run's seed; break-even on synthetic timings.
"""

from __future__ import annotations

# (what the mistake is, the code, a word from the name of the check that must fail)
WRONG: list[tuple[str, str, str]] = [
    ("compile counting without torch._dynamo.reset()", """
        def count_compiles(model, inputs):
            graphs = 0
            def backend(gm, example_inputs):
                nonlocal graphs
                graphs += 1
                return gm.forward
            compiled = torch.compile(model, backend=backend)
            for x in inputs:
                compiled(x)
            return graphs
        """, "recompilations"),
    ("mean instead of median", """
        def steady_state(times, warmup):
            if not 0 <= warmup < len(times):
                raise ValueError("warmup leaves nothing to measure")
            return statistics.mean(times[warmup:])
        """, "steady state"),
    ("speedup upside down", """
        def speedup(baseline_times, new_times, warmup):
            return steady_state(new_times, warmup) / steady_state(baseline_times, warmup)
        """, "speedup"),
    ("TF32 through the CUDA flag only, nothing returned", """
        def set_tf32(enabled):
            torch.backends.cuda.matmul.allow_tf32 = enabled
        """, "TF32"),
    ("slow steps against the mean", """
        def slow_steps(times, factor=3.0):
            mean = statistics.mean(times)
            return [i for i, t in enumerate(times) if t > factor * mean]
        """, "slow steps"),
    # ---- the graph break
    ("the given function unchanged (.item() and an if)", """
        soft_normalize_one_graph = soft_normalize
        """, "one graph"),
    ("the .item() dropped but the if kept on a tensor (data-dependent branch)", """
        def soft_normalize_one_graph(x, bias, max_rms=1.0):
            h = F.silu(x + bias)
            rms = h.pow(2).mean().sqrt()
            if rms > max_rms:
                h = h * (max_rms / rms)
            return x + h
        """, "one graph"),
    ("the value moved to Python with float() / NumPy instead of .item()", """
        def soft_normalize_one_graph(x, bias, max_rms=1.0):
            h = F.silu(x + bias)
            rms = float(h.pow(2).mean().sqrt().numpy())
            return x + h * min(1.0, max_rms / rms)
        """, "one graph"),
    ("the branch removed: never scales", """
        def soft_normalize_one_graph(x, bias, max_rms=1.0):
            return x + F.silu(x + bias)
        """, "same values"),
    ("always scales to max_rms, also when the RMS is under it", """
        def soft_normalize_one_graph(x, bias, max_rms=1.0):
            h = F.silu(x + bias)
            return x + h * (max_rms / h.pow(2).mean().sqrt())
        """, "same values"),
    ("clips each element at max_rms instead of scaling", """
        def soft_normalize_one_graph(x, bias, max_rms=1.0):
            return x + torch.clamp(F.silu(x + bias), -max_rms, max_rms)
        """, "same values"),
    ("the limit ignored (1.0 written in)", """
        def soft_normalize_one_graph(x, bias, max_rms=1.0):
            h = F.silu(x + bias)
            return x + h * torch.clamp(1.0 / h.pow(2).mean().sqrt(), max=1.0)
        """, "same values"),
    # ---- break-even
    ("break-even forgets that the first call also does the work", """
        def break_even_calls(first_call_s, eager_s, compiled_s):
            if compiled_s >= eager_s:
                return None
            return max(1, math.ceil(first_call_s / (eager_s - compiled_s)))
        """, "break-even"),
    ("break-even as a fraction of a call", """
        def break_even_calls(first_call_s, eager_s, compiled_s):
            if compiled_s >= eager_s:
                return None
            return (first_call_s - compiled_s) / (eager_s - compiled_s)
        """, "break-even"),
    ("break-even rounded down (one call short)", """
        def break_even_calls(first_call_s, eager_s, compiled_s):
            if compiled_s >= eager_s:
                return None
            return max(1, int((first_call_s - compiled_s) / (eager_s - compiled_s)))
        """, "break-even"),
    ("break-even negative when compile never pays off", """
        def break_even_calls(first_call_s, eager_s, compiled_s):
            if compiled_s == eager_s:
                return None
            return math.ceil((first_call_s - compiled_s) / (eager_s - compiled_s))
        """, "break-even"),
    ("break-even without the n >= 1 floor (0 calls when the first call is as cheap as a steady one)", """
        def break_even_calls(first_call_s, eager_s, compiled_s):
            if compiled_s >= eager_s:
                return None
            return math.ceil((first_call_s - compiled_s) / (eager_s - compiled_s))
        """, "break-even"),
    ("break-even from the cold start over the eager time", """
        def break_even_calls(first_call_s, eager_s, compiled_s):
            if compiled_s >= eager_s:
                return None
            return math.ceil(first_call_s / eager_s)
        """, "break-even"),
]

# (what differs from the solution, the code): each must pass every check of exercise 03
RIGHT: list[tuple[str, str]] = [
    ("count_compiles with torch._dynamo's CompileCounter", """
        def count_compiles(model, inputs):
            from torch._dynamo.testing import CompileCounter
            torch._dynamo.reset()
            counter = CompileCounter()
            compiled = torch.compile(model, backend=counter)
            for x in inputs:
                compiled(x)
            return counter.frame_count
        """),
    ("graph break removed with torch.where", """
        def soft_normalize_one_graph(x, bias, max_rms=1.0):
            h = F.silu(x + bias)
            rms = torch.sqrt(torch.mean(h * h))
            return x + torch.where(rms > max_rms, h * (max_rms / rms), h)
        """),
    ("graph break removed by dividing by clamp(rms / max_rms, min=1)", """
        def soft_normalize_one_graph(x, bias, max_rms=1.0):
            h = torch.nn.functional.silu(x + bias)
            return x + h / (h.square().mean().sqrt() / max_rms).clamp(min=1.0)
        """),
    ("break-even by counting calls in a loop", """
        def break_even_calls(first_call_s, eager_s, compiled_s):
            if not compiled_s < eager_s:
                return None
            n = 1
            while first_call_s + (n - 1) * compiled_s > n * eager_s:
                n += 1
            return n
        """),
]
