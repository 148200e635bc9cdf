"""Exercise 20 (a training step's memory by category): realistic mistakes fail a named check, correct alternatives
pass. Judged exactly as the grader judges (observe -> save -> load -> replay), see tests/test_grading_variants.py.

Every wrong row is the solution with one rule broken, written through ``_memory`` below (defined in each row's code),
so each row differs from the right answer in exactly the way its name says.
"""

from __future__ import annotations

# The solution, with switches for each mistake; each row's code defines it and then predict_memory through it.
_MEMORY = """
    def _memory(widths, batch, dropout, dtype, optimizer, *, moments=2, momentum_state=1, plain_sgd_state=0,
                activation_size=None, param_size=None, relu_saves=True, mask=True, relu_twice=False, x=True,
                log_softmax=True, input_grad=False):
        size = {"float32": 4, "bfloat16": 2}[dtype]
        p_size = param_size or size
        a_size = activation_size or size
        layers = list(zip(widths[:-1], widths[1:]))
        params = sum(a * b + b for a, b in layers)
        state = {"adamw": moments * params * p_size + 4 * 2 * len(layers),
                 "sgd_momentum": momentum_state * params * p_size, "sgd": plain_sgd_state * params * p_size}
        saved = batch * widths[0] if x else 0
        for h in widths[1:-1]:
            if dropout > 0:
                saved += batch * h * ((1 if relu_saves else 0) + (1 if mask else 0) + 1)
            else:
                saved += batch * h * (2 if relu_twice else 1)
        saved += batch * widths[-1] if log_softmax else 0
        grads = params * p_size + (batch * widths[0] * size if input_grad else 0)
        return {"parameters": params * p_size, "gradients": grads, "optimizer_state": state[optimizer],
                "activations": saved * a_size + batch * 8 + a_size}
"""


def _row(name: str, switches: str, check: str) -> tuple[str, str, str]:
    return (name, _MEMORY + f"""
    def predict_memory(widths, batch, dropout, dtype, optimizer):
        return _memory(widths, batch, dropout, dtype, optimizer, {switches})
    """, check)


# (what the mistake is, the code, a word from the name of the check that must fail)
WRONG = [
    _row("Adam's two moments counted as one", "moments=1", "optimizer state"),
    _row("SGD with momentum given no state", "momentum_state=0", "optimizer state"),
    _row("plain SGD given a momentum buffer", "plain_sgd_state=1", "optimizer state"),
    _row("bf16 activations counted at fp32 size", "activation_size=4", "activations"),
    _row("bf16 parameters counted at fp32 size", "param_size=4", "parameters"),
    _row("what ReLU saves ignored (its output is not the next input when dropout follows)", "relu_saves=False",
         "activations"),
    _row("the dropout mask ignored", "mask=False", "activations"),
    _row("ReLU's output counted twice without dropout (it is the next Linear's input: one storage)",
         "relu_twice=True", "activations"),
    _row("the input x forgotten (the first Linear keeps it for the weight's gradient)", "x=False", "activations"),
    _row("log_softmax's output forgotten", "log_softmax=False", "activations"),
    _row("a gradient counted for the input, which needs none", "input_grad=True", "gradients"),
]

RIGHT = [
    ("a per-layer loop, sizes from torch.finfo, the few-byte scalars left out", """
        def predict_memory(widths, batch, dropout, dtype, optimizer):
            size = torch.finfo(getattr(torch, dtype)).bits // 8
            params = saved = 0
            for i in range(len(widths) - 1):
                params += widths[i] * widths[i + 1] + widths[i + 1]
                saved += batch * widths[i]  # every Linear's input
                if i > 0 and dropout > 0:
                    saved += 2 * batch * widths[i]  # ReLU's output and the mask, next to dropout's output
            saved += batch * widths[-1]
            per_param = {"adamw": 2, "sgd_momentum": 1, "sgd": 0}[optimizer]
            return {"parameters": size * params, "gradients": size * params,
                    "optimizer_state": per_param * size * params, "activations": size * saved + 8 * batch}
        """),
    ("a closed form, a dict of dtype sizes, numpy integers", """
        import numpy as np

        SIZES = {"float32": 4, "bfloat16": 2}

        def predict_memory(widths, batch, dropout, dtype, optimizer):
            w = np.array(widths)
            s = SIZES[dtype]
            params = int(np.sum(w[:-1] * w[1:] + w[1:]))
            hidden = int(np.sum(w[1:-1]))
            copies = 3 if dropout else 1
            act = np.int64(batch * (w[0] + copies * hidden + w[-1]) * s + 8 * batch + s)
            n_tensors = 2 * (len(w) - 1)
            state = {"adamw": 2 * params * s + 4 * n_tensors, "sgd_momentum": params * s, "sgd": 0}
            return {"parameters": np.int64(params * s), "gradients": np.int64(params * s),
                    "optimizer_state": np.int64(state[optimizer]), "activations": act}
        """),
]
