"""Exercise 14 (checkpoints): realistic wrong variants fail their check, correct alternatives pass every check.

Each row redefines ``save_checkpoint`` / ``load_checkpoint`` on top of the solution notebook's cells and is judged
through the grader's own observe -> save -> load -> replay path (see tests/test_grading_variants.py).
"""

from __future__ import annotations

# Pieces the rows share: the solution's own functions, wrapped.
WRAP = """
        _save, _load = save_checkpoint, load_checkpoint
"""

# (what the mistake is, the code, a word from the name of the check that must fail)
WRONG: list[tuple[str, str, str]] = [
    ("saves model.state_dict() and the step only", """
        def save_checkpoint(path, model, optimizer, scaler, data, step):
            torch.save({"model": model.state_dict(), "step": step}, path)

        def load_checkpoint(path, model, optimizer, scaler, data):
            state = torch.load(path, weights_only=True)
            model.load_state_dict(state["model"])
            return state["step"]
        """, "weights, optimizer"),
    ("forgets the optimizer state", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            fresh_optimizer = optimizer.state_dict()
            step = _load(path, model, optimizer, scaler, data)
            optimizer.load_state_dict(fresh_optimizer)
            return step
        """, "weights, optimizer"),
    ("restores the step off by one", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            return _load(path, model, optimizer, scaler, data) + 1
        """, "weights, optimizer"),
    ("forgets the RNG states", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            rngs = torch.get_rng_state(), np.random.get_state(), random.getstate()
            step = _load(path, model, optimizer, scaler, data)
            torch.set_rng_state(rngs[0]); np.random.set_state(rngs[1]); random.setstate(rngs[2])
            return step
        """, "RNG"),
    ("restores torch's RNG but not numpy's and Python's", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            rngs = np.random.get_state(), random.getstate()
            step = _load(path, model, optimizer, scaler, data)
            np.random.set_state(rngs[0]); random.setstate(rngs[1])
            return step
        """, "RNG"),
    ("draws a random number after restoring the RNGs", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            step = _load(path, model, optimizer, scaler, data)
            torch.rand(1)  # e.g. a re-initialised layer after the RNG was restored
            return step
        """, "RNG"),
    ("restarts the data from the epoch start", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            step = _load(path, model, optimizer, scaler, data)
            data.load_state_dict({"epoch": data.epoch, "position": 0})
            return step
        """, "data position"),
    ("forgets the GradScaler", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            fresh = scaler.state_dict()
            step = _load(path, model, optimizer, scaler, data)
            scaler.load_state_dict(fresh)
            return step
        """, "GradScaler"),
    ("writes in place with torch.save(state, path)", WRAP + """
        def save_checkpoint(path, model, optimizer, scaler, data, step):
            kind, keys, pos, has_gauss, gauss = np.random.get_state()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "step": step, "data": data.state_dict(),
                        "rng": {"torch": torch.get_rng_state(), "cuda": None,
                                "numpy": (kind, keys.tolist(), pos, has_gauss, gauss),
                                "python": random.getstate()}}, path)
        """, "fails mid-write"),
    ("serialises to memory, then overwrites the file in place", WRAP + """
        import io
        def save_checkpoint(path, model, optimizer, scaler, data, step):
            kind, keys, pos, has_gauss, gauss = np.random.get_state()
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "step": step, "data": data.state_dict(),
                        "rng": {"torch": torch.get_rng_state(), "cuda": None,
                                "numpy": (kind, keys.tolist(), pos, has_gauss, gauss),
                                "python": random.getstate()}}, buffer)
            with open(path, "wb") as f:
                f.write(buffer.getvalue())
        """, "fails mid-write"),
    ("writes in place and ignores errors", WRAP + """
        def save_checkpoint(path, model, optimizer, scaler, data, step):
            try:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
            except Exception:
                pass  # "a failed save should not stop training"
        """, "fails mid-write"),
    ("numpy's state restored as (kind, keys, pos): the cached Gaussian dropped", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            step = _load(path, model, optimizer, scaler, data)
            kind, keys, pos, _, _ = np.random.get_state()
            np.random.set_state((kind, keys, pos))  # the fields that look like the state
            return step
        """, "RNG"),
    ("temporary file in the system's temp folder (tempfile.mkstemp() without dir=)", WRAP + """
        def save_checkpoint(path, model, optimizer, scaler, data, step):
            fd, tmp = tempfile.mkstemp(suffix=".pt")
            os.close(fd)
            try:
                _save(tmp, model, optimizer, scaler, data, step)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        """, "fails mid-write"),
    ("temporary file beside the checkpoint, never removed when the save fails", WRAP + """
        def save_checkpoint(path, model, optimizer, scaler, data, step):
            kind, keys, pos, has_gauss, gauss = np.random.get_state()
            tmp = str(path) + ".tmp"
            with open(tmp, "wb") as f:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scaler": scaler.state_dict(), "step": step, "data": data.state_dict(),
                            "rng": {"torch": torch.get_rng_state(), "cuda": None,
                                    "numpy": (kind, keys.tolist(), pos, has_gauss, gauss),
                                    "python": random.getstate()}}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        """, "fails mid-write"),
    ("a missing checkpoint silently starts over", WRAP + """
        def load_checkpoint(path, model, optimizer, scaler, data):
            if not os.path.exists(path):
                return 0
            return _load(path, model, optimizer, scaler, data)
        """, "clear error"),
]

# (what differs from the solution, the code)
RIGHT: list[tuple[str, str]] = [
    ("torch.random.get_rng_state, a flat dict layout, NamedTemporaryFile", """
        def save_checkpoint(path, model, optimizer, scaler, data, step):
            path = Path(path)
            state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "scaler": scaler.state_dict(),
                     "step": step, "epoch": data.epoch, "position": data.position,
                     "torch_rng": torch.random.get_rng_state(), "numpy_rng": np.random.get_state(),
                     "python_rng": random.getstate()}
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
                try:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                except BaseException:
                    f.close()
                    os.unlink(f.name)
                    raise
            try:
                os.replace(f.name, path)
            finally:
                if os.path.exists(f.name):
                    os.unlink(f.name)

        def load_checkpoint(path, model, optimizer, scaler, data):
            try:
                state = torch.load(path, weights_only=False)  # holds a numpy array; this is our own file
            except FileNotFoundError:
                raise
            except Exception as exc:
                raise ValueError(f"{path} is not a readable checkpoint: {exc}") from exc
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])
            scaler.load_state_dict(state["scaler"])
            data.load_state_dict({"epoch": state["epoch"], "position": state["position"]})
            torch.random.set_rng_state(state["torch_rng"])
            np.random.set_state(state["numpy_rng"])
            random.setstate(state["python_rng"])
            return state["step"]
        """),
    ("writes the temporary file by hand and removes it on failure", WRAP + """
        def save_checkpoint(path, model, optimizer, scaler, data, step):
            tmp = str(path) + ".tmp"
            _save(tmp, model, optimizer, scaler, data, step)  # the solution, to a name of its own
            os.replace(tmp, path)
        """),
]
