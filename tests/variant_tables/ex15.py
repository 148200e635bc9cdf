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
]
