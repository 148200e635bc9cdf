"""Exercise 16 (channels_last, thread counts): realistic mistakes fail a named check, correct alternatives pass.

Judged exactly as the grader judges (observe -> save -> load -> replay), see tests/test_grading_variants.py.
"""

from __future__ import annotations

# (what the mistake is, the code, a word from the name of the check that must fail)
WRONG = [
    ("only the batch converted", """
        def to_channels_last(model, x):
            return model, x.contiguous(memory_format=torch.channels_last)
        """, "weights converted"),
    ("only the model converted", """
        def to_channels_last(model, x):
            return model.to(memory_format=torch.channels_last), x
        """, "batch converted"),
    ("the batch permuted to [N, H, W, C]", """
        def to_channels_last(model, x):
            return model.to(memory_format=torch.channels_last), x.permute(0, 2, 3, 1).contiguous()
        """, "batch converted"),
    ("the batch permuted to [N, H, W, C]: outputs", """
        def to_channels_last(model, x):
            return model.to(memory_format=torch.channels_last), x.permute(0, 2, 3, 1).contiguous()
        """, "outputs unchanged"),
    ("plain .contiguous() (already NCHW: nothing changes)", """
        def to_channels_last(model, x):
            return model.to(memory_format=torch.channels_last), x.contiguous()
        """, "batch converted"),
    ("workers ignored", """
        def intra_op_threads(cores, workers=0, busy=0):
            return max(1, cores - busy)
        """, "leave"),
    ("this machine's os.cpu_count() instead of `cores`", """
        import os
        def intra_op_threads(cores, workers=0, busy=0):
            return max(1, os.cpu_count() - workers - busy)
        """, "leave"),
    ("half the cores, always", """
        def intra_op_threads(cores, workers=0, busy=0):
            return max(1, cores // 2)
        """, "leave"),
    ("no floor: zero or negative threads when the cores are taken", """
        def intra_op_threads(cores, workers=0, busy=0):
            return cores - workers - busy
        """, "fewer than one"),
    ("threads per rank: the cores left not shared (every rank takes them all)", """
        def threads_per_rank(cores, ranks, workers_per_rank=0, busy=0):
            return max(1, cores - ranks * workers_per_rank - busy)
        """, "equal share"),
    ("threads per rank: one rank's workers counted, not every rank's", """
        def threads_per_rank(cores, ranks, workers_per_rank=0, busy=0):
            return max(1, (cores - workers_per_rank - busy) // ranks)
        """, "equal share"),
    ("threads per rank: rounded up (more threads than free cores)", """
        import math
        def threads_per_rank(cores, ranks, workers_per_rank=0, busy=0):
            return max(1, math.ceil((cores - ranks * workers_per_rank - busy) / ranks))
        """, "equal share"),
    ("threads per rank: true division (a fraction of a thread)", """
        def threads_per_rank(cores, ranks, workers_per_rank=0, busy=0):
            return max(1, (cores - ranks * workers_per_rank - busy) / ranks)
        """, "equal share"),
    ("threads per rank: torchrun's default kept (1 whatever the machine)", """
        def threads_per_rank(cores, ranks, workers_per_rank=0, busy=0):
            return 1
        """, "equal share"),
    ("threads per rank: no floor", """
        def threads_per_rank(cores, ranks, workers_per_rank=0, busy=0):
            return (cores - ranks * workers_per_rank - busy) // ranks
        """, "at least one"),
]

RIGHT = [
    ("x.to(memory_format=...) and a permute round trip", """
        def to_channels_last(model, x):
            model = model.to(memory_format=torch.channels_last)
            return model, x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        """),
    ("each conv weight converted by hand", """
        def to_channels_last(model, x):
            for module in model.modules():
                if isinstance(module, nn.Conv2d):
                    module.weight.data = module.weight.data.contiguous(memory_format=torch.channels_last)
            return model, x.to(memory_format=torch.channels_last)
        """),
    ("threads written with if/else", """
        def intra_op_threads(cores, workers=0, busy=0):
            left = cores - workers - busy
            if left < 1:
                return 1
            return left
        """),
    ("threads per rank: each rank's share of the machine, less its own workers", """
        def threads_per_rank(cores, ranks, workers_per_rank=0, busy=0):
            return max(1, (cores - busy) // ranks - workers_per_rank)
        """),
    ("threads per rank: built on intra_op_threads", """
        def threads_per_rank(cores, ranks, workers_per_rank=0, busy=0):
            return max(1, intra_op_threads(cores, ranks * workers_per_rank, busy) // ranks)
        """),
]
