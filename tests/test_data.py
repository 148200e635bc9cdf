"""The data layer: generation, keyed augmentation, sampler, loader validation, text padding, in-memory batching."""

from __future__ import annotations

import hashlib
import itertools
import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from course_lib.data import (
    DatasetUnavailable,
    DeviceBatcher,
    LoaderConfigError,
    ResumableSampler,
    generate_shapes,
    load_image_datasets,
    load_image_tensors,
    load_text_datasets,
    make_loader,
    pad_collate,
)
from course_lib.data.cli import main as data_cli
from course_lib.data.shapes import CLASS_NAMES, META_FILE


@pytest.fixture(scope="module")
def shapes():
    return load_image_datasets("shapes")


@pytest.fixture(scope="module")
def text():
    return load_text_datasets(block_size=64)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.jpg"))}


# --- generation ----------------------------------------------------------------------------------------------
def test_generation_is_deterministic_and_seed_dependent(tmp_path):
    a = generate_shapes(tmp_path / "a", n_train=2, n_val=1, image_size=32, seed=0, progress=False)
    b = generate_shapes(tmp_path / "b", n_train=2, n_val=1, image_size=32, seed=0, progress=False)
    c = generate_shapes(tmp_path / "c", n_train=2, n_val=1, image_size=32, seed=1, progress=False)
    files_a, files_b, files_c = _tree_bytes(a), _tree_bytes(b), _tree_bytes(c)
    assert len(files_a) == len(CLASS_NAMES) * 3
    assert files_a == files_b
    assert files_a.keys() == files_c.keys()
    assert all(files_a[k] != files_c[k] for k in files_a)


def test_generation_is_idempotent_and_redoes_an_interrupted_run(tmp_path):
    root = generate_shapes(tmp_path, n_train=1, n_val=1, image_size=16, progress=False)
    some_file = next(root.rglob("*.jpg"))
    stamp = some_file.stat().st_mtime_ns
    generate_shapes(tmp_path, n_train=1, n_val=1, image_size=16, progress=False)
    assert some_file.stat().st_mtime_ns == stamp  # complete: nothing rewritten
    (root / META_FILE).unlink()  # as if killed before the marker was written
    stray = root / "train" / CLASS_NAMES[0] / "999.jpg"
    stray.write_bytes(b"partial")
    generate_shapes(tmp_path, n_train=1, n_val=1, image_size=16, progress=False)
    assert (root / META_FILE).is_file() and not stray.exists()


def test_generation_rejects_bad_sizes(tmp_path):
    with pytest.raises(ValueError, match="n_train"):
        generate_shapes(tmp_path, n_train=0, n_val=1, image_size=32)


def test_train_and_val_are_disjoint(shapes):
    train_hashes = {hashlib.sha256(Path(p).read_bytes()).digest() for p, _ in shapes.train.samples}
    val_hashes = {hashlib.sha256(Path(p).read_bytes()).digest() for p, _ in shapes.val.samples}
    assert len(train_hashes) == len(shapes.train) and len(val_hashes) == len(shapes.val)
    assert not train_hashes & val_hashes


def test_samples_are_finite_normalised_tensors_with_valid_labels(shapes):
    assert shapes.num_classes == len(CLASS_NAMES) >= 10
    assert sorted(shapes.class_names) == sorted(CLASS_NAMES)
    labels = set()
    for x, y in make_loader(shapes.train, batch_size=64, train=False):
        assert x.shape[1:] == (3, shapes.image_size, shapes.image_size) and x.dtype == torch.float32
        assert torch.isfinite(x).all()
        labels.update(y.tolist())
    assert labels == set(range(shapes.num_classes))


# --- keyed augmentation ----------------------------------------------------------------------------------------
def test_aug_seed_key_is_a_pure_function_and_leaves_global_rng_alone(shapes):
    state = torch.get_rng_state()
    first, label = shapes.train[(5, 1234)]
    assert torch.equal(torch.get_rng_state(), state)
    torch.rand(10)  # move the global RNG: the keyed sample must not care
    again, label_again = shapes.train[(5, 1234)]
    other, _ = shapes.train[(5, 1235)]
    assert torch.equal(first, again) and label == label_again
    assert not torch.equal(first, other)
    plain, _ = shapes.train[5]  # an int key still works
    assert plain.shape == first.shape


def test_keys_give_identical_batches_across_worker_counts(shapes):
    def batches(workers: int) -> list[torch.Tensor]:
        loader = make_loader(shapes.train, batch_size=16, train=True, num_workers=workers, seed=3)
        loader.sampler.set_epoch(1)
        return [x for x, _ in itertools.islice(loader, 4)]

    in_main, in_workers = batches(0), batches(2)
    assert len(in_main) == len(in_workers) > 0
    assert all(torch.equal(a, b) for a, b in zip(in_main, in_workers))


@pytest.mark.slow
def test_loader_works_under_spawn(text):
    # Workers started with "spawn" re-import everything and unpickle the dataset, collate_fn and worker_init_fn:
    # this only works when they live at module scope in an importable package.
    loader = make_loader(text.train, batch_size=8, train=True, num_workers=2, multiprocessing_context="spawn")
    x, y, lengths = next(iter(loader))
    assert x.shape[0] == 8 and x.shape == y.shape and lengths.shape == (8,)


# --- sampler ---------------------------------------------------------------------------------------------------
def test_sampler_order_is_a_function_of_seed_and_epoch():
    def order(seed: int, epoch: int) -> list:
        s = ResumableSampler(50, shuffle=True, seed=seed, yield_seeds=False)
        s.set_epoch(epoch)
        return list(s)

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1) and order(0, 0) != order(1, 0)
    assert sorted(order(0, 2)) == list(range(50))
    assert list(ResumableSampler(7, shuffle=False, yield_seeds=False)) == list(range(7))


@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_shards_like_distributed_sampler(drop_last):
    n, world = 23, 4
    shards = []
    for rank in range(world):
        ours = ResumableSampler(n, shuffle=True, seed=5, rank=rank, world_size=world, drop_last=drop_last,
                                yield_seeds=False)
        torch_sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=5,
                                           drop_last=drop_last)
        ours.set_epoch(2)
        torch_sampler.set_epoch(2)
        assert list(ours) == list(torch_sampler) and len(ours) == len(torch_sampler)
        shards.append(list(ours))
    covered = set().union(*map(set, shards))
    assert covered == set(range(n)) if not drop_last else len(covered) == n // world * world


def test_unpadded_shards_are_disjoint_and_cover_everything():
    shards = [list(ResumableSampler(23, shuffle=False, rank=r, world_size=4, yield_seeds=False, pad=False))
              for r in range(4)]
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(23))  # each sample exactly once


def test_sampler_resumes_from_a_position_then_resets():
    full = ResumableSampler(30, shuffle=True, seed=1)
    full.set_epoch(3)
    everything = list(full)
    assert all(isinstance(k, tuple) and len(k) == 2 for k in everything)
    resumed = ResumableSampler(30, shuffle=True, seed=1)
    resumed.load_state_dict({"epoch": 3, "position": 12, "seed": 1})
    resumed.set_epoch(3)  # the loop's usual call keeps the restored position
    assert len(resumed) == 18
    assert list(resumed) == everything[12:]  # exactly the rest, same aug seeds
    assert list(resumed) == everything  # the position applied to one pass only
    resumed.set_position(5)
    resumed.set_epoch(4)  # a new epoch starts at 0
    assert len(list(resumed)) == 30


def test_sampler_state_dict_round_trip_and_mismatch():
    s = ResumableSampler(40, shuffle=True, seed=9, world_size=2, rank=1)
    s.set_epoch(2)
    s.set_position(7)
    t = ResumableSampler(40, shuffle=True, world_size=2, rank=1)
    t.load_state_dict(s.state_dict())
    assert list(t) == list(s)
    with pytest.raises(ValueError, match="n="):
        ResumableSampler(41, shuffle=True).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="set_position"):
        s.set_position(999)


def test_aug_seeds_differ_between_positions_and_epochs():
    s = ResumableSampler(20, shuffle=True, seed=0)
    seeds0 = [seed for _, seed in s]
    s.set_epoch(1)
    seeds1 = [seed for _, seed in s]
    assert len(set(seeds0)) == 20 and not set(seeds0) & set(seeds1)


def test_resumed_loader_continues_with_identical_batches(shapes):
    def loader():
        return make_loader(shapes.train, batch_size=16, train=True, num_workers=0, seed=4)

    reference = [x for x, _ in itertools.islice(loader(), 6)]
    resumed = loader()
    resumed.sampler.set_position(3 * 16)  # three batches were trained on before the interruption
    assert len(resumed) == len(shapes.train) // 16 - 3
    rest = [x for x, _ in itertools.islice(resumed, 3)]
    assert all(torch.equal(a, b) for a, b in zip(reference[3:], rest, strict=True))


# --- make_loader validation --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"prefetch_factor": 2}, "prefetch_factor"),
        ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor"),
        ({"persistent_workers": True}, "persistent_workers"),
        ({"drop_last": "yes"}, "drop_last"),
        ({"collate_fn": 3}, "collate_fn"),
        ({"world_size": 0}, "world_size"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"batch_size": 10_000}, "batch_size"),
        ({"multiprocessing_context": "spawn"}, "multiprocessing_context"),
        ({"sampler": ResumableSampler(5, shuffle=False), "world_size": 2}, "sampler"),
    ],
)
def test_make_loader_rejects_bad_arguments(shapes, kwargs, argument):
    args = {"batch_size": 4, "train": True, **kwargs}
    with pytest.raises(LoaderConfigError, match=argument):
        make_loader(shapes.train, **args)


def test_make_loader_defaults(shapes):
    train = make_loader(shapes.train, batch_size=7, train=True)
    val = make_loader(shapes.val, batch_size=7, train=False)
    assert train.drop_last and not val.drop_last
    assert not train.pin_memory
    assert sum(len(y) for _, y in val) == len(shapes.val)
    assert [y.tolist() for _, y in val] == [y.tolist() for _, y in val]  # stable validation order


def test_make_loader_pin_memory_without_cuda_says_so_once(shapes, monkeypatch):
    import warnings

    from course_lib.data import loaders

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaders._warn_pinning_needs_cuda.cache_clear()
    with pytest.warns(UserWarning, match="no CUDA device here, so batches are not pinned"):
        pinned = make_loader(shapes.train, batch_size=7, train=True, pin_memory=True)
    assert pinned.pin_memory is False  # pinning only helps CUDA transfers
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second loader: no second warning
        assert make_loader(shapes.val, batch_size=7, train=False, pin_memory=True).pin_memory is False


# --- text --------------------------------------------------------------------------------------------------------
def test_text_samples_have_variable_length_and_round_trip(text):
    lengths = [len(text.train[i]) for i in range(len(text.train))]
    assert min(lengths) * 3 < max(lengths) <= text.block_size + 1
    line = text.decode(text.train[0])
    assert torch.equal(text.encode(line), text.train[0])
    assert text.vocab_size == len(text.stoi) == len(text.itos)


def test_pad_collate_shifts_and_pads_with_ignore_index():
    a, b = torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6])
    x, y, lengths = pad_collate([a, b])
    assert x.shape == y.shape == (2, 3) and lengths.tolist() == [3, 1]
    assert x[0].tolist() == [1, 2, 3] and y[0].tolist() == [2, 3, 4]
    assert x[1, 0] == 5 and y[1].tolist() == [6, -100, -100]
    assert int((y != -100).sum()) == int(lengths.sum())


def test_text_loader_pads_by_default(text):
    x, y, lengths = next(iter(make_loader(text.train, batch_size=8, train=True)))
    assert x.shape == y.shape and x.shape[0] == 8 and x.shape[1] == int(lengths.max())
    assert ((y == -100).sum(1) == x.shape[1] - lengths).all()


# --- in-memory batching -------------------------------------------------------------------------------------------
def test_device_batcher_shapes_determinism_and_augmentation():
    tensors = load_image_tensors("shapes", progress=False)
    assert tensors.train_images.dtype == torch.uint8 and tensors.train_images.shape[1] == 3
    make = lambda augment, seed=0: DeviceBatcher(  # noqa: E731
        tensors.train_images, tensors.train_labels, batch_size=32, device="cpu", augment=augment, seed=seed)
    batches = list(make(True))
    assert len(batches) == len(tensors.train_images) // 32
    x, y = batches[0]
    assert x.shape == (32, 3, tensors.image_size, tensors.image_size) and x.dtype == torch.float32
    assert y.dtype == torch.long and torch.isfinite(x).all()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, make(True)))  # same seed, same epoch
    plain_x, plain_y = next(iter(make(False)))
    assert torch.equal(plain_y, y) and not torch.equal(plain_x, x)  # same order, different pixels
    other = make(True)
    other.set_epoch(1)
    assert not torch.equal(next(iter(other))[1], y)


def test_device_batcher_rejects_float_images():
    with pytest.raises(ValueError, match="uint8"):
        DeviceBatcher(torch.rand(4, 3, 8, 8), torch.zeros(4), batch_size=2, device="cpu")


# --- CIFAR-10 offline -------------------------------------------------------------------------------------------
def test_cifar10_unavailable_offline_explains_how_to_provide_it(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_ALLOW_DOWNLOAD", "0")
    with pytest.raises(DatasetUnavailable) as error:
        load_image_datasets("cifar10", root=tmp_path)
    message = str(error.value)
    assert "cifar-10-python.tar.gz" in message and str(tmp_path) in message and "shapes" in message
    assert isinstance(error.value, RuntimeError)


# --- CLI ------------------------------------------------------------------------------------------------------------
def test_cli_prepare_and_info(capsys):
    assert data_cli(["prepare", "--quiet"]) == 0
    assert data_cli(["info"]) == 0
    out = capsys.readouterr().out
    assert "shapes" in out and "circle" in out and os.environ["COURSE_DATA_DIR"] in out


def test_counting_dataset_counts_only_in_its_own_process() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from course_lib.data import CountingDataset

    ds = CountingDataset(TensorDataset(torch.arange(8.0)))
    assert len(ds) == 8
    list(DataLoader(ds, batch_size=4, num_workers=0))
    assert ds.calls == 8  # main process: counted here
    list(DataLoader(ds, batch_size=4, num_workers=1))
    assert ds.calls == 8  # the worker counted in its own copy; nothing came back
