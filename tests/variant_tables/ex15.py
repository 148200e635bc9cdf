"""Exercise 15 (activation checkpointing): realistic mistakes fail a named check, correct alternatives pass.

Judged exactly as the grader judges (observe -> save -> load -> replay), see tests/test_grading_variants.py.
"""

from __future__ import annotations

# The counter with its record of storages shared by every call: right the first time only.
SHARED_DICT = """
        def count_saved_bytes(fn, exclude=(), sizes={}):
            skip = {t.untyped_storage().data_ptr() for t in exclude}
            def pack(t):
                if t.untyped_storage().data_ptr() not in skip:
                    sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fn()
            return sum(sizes.values())
        """


def _plan(*, order: str = "sorted(range(len(plain)), key=lambda i: (-(plain[i] - checkpointed[i]), i))",
          stop: str = "total <= budget", result: str = "sorted(chosen)",
          refuse: str = 'raise ValueError(f"misses by {sum(checkpointed) - budget} bytes")') -> str:
    """The solution's plan with one piece replaced (what learners get wrong is usually one line)."""
    return f"""
        def blocks_to_checkpoint(plain, checkpointed, budget):
            if sum(checkpointed) > budget:
                {refuse}
            total, chosen = sum(plain), []
            for i in {order}:
                if {stop}:
                    break
                total -= plain[i] - checkpointed[i]
                chosen.append(i)
            return {result}
        """


# (what the mistake is, the code, a word from the name of the check that must fail)
WRONG = [
    ("use_reentrant=True: block 0's parameters get no gradient", """
        def checkpointed_forward(blocks, x, which):
            for i, block in enumerate(blocks):
                x = checkpoint(block, x, use_reentrant=True) if i in set(which) else block(x)
            return x
        """, "same gradients"),
    ("preserve_rng_state=False: other dropout masks in the recomputation", """
        def checkpointed_forward(blocks, x, which):
            for i, block in enumerate(blocks):
                x = (checkpoint(block, x, use_reentrant=False, preserve_rng_state=False) if i in set(which)
                     else block(x))
            return x
        """, "same gradients"),
    ("chosen blocks run under torch.no_grad() instead of checkpoint", """
        def checkpointed_forward(blocks, x, which):
            for i, block in enumerate(blocks):
                if i in set(which):
                    with torch.no_grad():
                        x = block(x)
                else:
                    x = block(x)
            return x
        """, "same gradients"),
    ("nothing checkpointed", """
        def checkpointed_forward(blocks, x, which):
            for block in blocks:
                x = block(x)
            return x
        """, "saves only"),
    ("every block checkpointed, `which` ignored", """
        def checkpointed_forward(blocks, x, which):
            for block in blocks:
                x = checkpoint(block, x, use_reentrant=False)
            return x
        """, "saves only"),
    ("a checkpointed block applied twice", """
        def checkpointed_forward(blocks, x, which):
            for i, block in enumerate(blocks):
                if i in set(which):
                    x = checkpoint(block, x, use_reentrant=False)
                x = block(x)
            return x
        """, "same outputs"),
    ("counter counts elements, not bytes", """
        def count_saved_bytes(fn, exclude=()):
            skip = {t.untyped_storage().data_ptr() for t in exclude}
            sizes = {}
            def pack(t):
                if t.untyped_storage().data_ptr() not in skip:
                    sizes[t.untyped_storage().data_ptr()] = t.numel()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fn()
            return sum(sizes.values())
        """, "count_saved_bytes"),
    ("counter counts a storage once per save", """
        def count_saved_bytes(fn, exclude=()):
            skip = {t.untyped_storage().data_ptr() for t in exclude}
            total = 0
            def pack(t):
                nonlocal total
                if t.untyped_storage().data_ptr() not in skip:
                    total += t.untyped_storage().nbytes()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fn()
            return total
        """, "count_saved_bytes"),
    ("counter ignores `exclude` (counts the weights)", """
        def count_saved_bytes(fn, exclude=()):
            sizes = {}
            def pack(t):
                sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fn()
            return sum(sizes.values())
        """, "count_saved_bytes"),
    ("counter counts the bytes of the saved views, not of their storages", """
        def count_saved_bytes(fn, exclude=()):
            skip = {t.untyped_storage().data_ptr() for t in exclude}
            sizes = {}
            def pack(t):
                if t.untyped_storage().data_ptr() not in skip:
                    sizes[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fn()
            return sum(sizes.values())
        """, "count_saved_bytes"),
    ("counter keeps its dict of storages between calls (a default argument)", SHARED_DICT, "count_saved_bytes"),
    ("plan: the first blocks of the stack until it fits", _plan(order="range(len(plain))"), "save most"),
    ("plan: the blocks that keep most plainly first (not those that save most)",
     _plan(order="sorted(range(len(plain)), key=lambda i: (-plain[i], i))"), "save most"),
    ("plan: stops only below the budget (< instead of <=)", _plan(stop="total < budget"), "save most"),
    ("plan: ties go to the higher index",
     _plan(order="sorted(range(len(plain)), key=lambda i: (-(plain[i] - checkpointed[i]), -i))"), "save most"),
    ("plan: indices in the order they were chosen, not sorted", _plan(result="chosen"), "save most"),
    ("plan: always checkpoints at least one block", _plan(stop="total <= budget and chosen"), "save most"),
    ("plan: every block when nothing fits, instead of an error", _plan(refuse="pass"), "ValueError"),
    ("plan: a ValueError that does not say by how much",
     _plan(refuse='raise ValueError("the budget is too small")'), "ValueError"),
]

RIGHT = [
    ("functools.partial over a frozenset of indices", """
        def checkpointed_forward(blocks, x, which):
            chosen = frozenset(which)
            for i, block in enumerate(blocks):
                run = functools.partial(checkpoint, block, use_reentrant=False) if i in chosen else block
                x = run(x)
            return x
        import functools
        """),
    ("counter keeping a list of (data_ptr, nbytes) pairs", """
        def count_saved_bytes(fn, exclude=()):
            skip = set(t.untyped_storage().data_ptr() for t in exclude)
            seen = []
            def pack(t):
                s = t.untyped_storage()
                if s.data_ptr() not in skip and s.data_ptr() not in [p for p, _ in seen]:
                    seen.append((s.data_ptr(), s.nbytes()))
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fn()
            return sum(n for _, n in seen)
        """),
    ("plan: take the largest saving left, one at a time, with max()", """
        def blocks_to_checkpoint(plain, checkpointed, budget):
            over = sum(checkpointed) - budget
            if over > 0:
                raise ValueError(f"checkpointing every block still needs {over} bytes more than the budget")
            left, chosen, total = set(range(len(plain))), [], sum(plain)
            while total > budget:
                best = max(left, key=lambda i: (plain[i] - checkpointed[i], -i))
                left.remove(best)
                chosen.append(best)
                total -= plain[best] - checkpointed[best]
            return sorted(chosen)
        """),
    ("plan: how many bytes must go, then a heap of savings", """
        import heapq
        def blocks_to_checkpoint(plain, checkpointed, budget):
            if budget < sum(checkpointed):
                raise ValueError(f"{sum(checkpointed) - budget} bytes over budget even with all blocks checkpointed")
            need = sum(plain) - budget
            heap = [(-(p - c), i) for i, (p, c) in enumerate(zip(plain, checkpointed))]
            heapq.heapify(heap)
            chosen = []
            while need > 0:
                saving, i = heapq.heappop(heap)
                need += saving
                chosen.append(i)
            return sorted(chosen)
        """),
]
