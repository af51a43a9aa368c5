"""nc.data: TensorDataset / DataLoader (order, coverage, uploads into guarded buffers, worker errors, early
exit), DistributedSampler against PyTorch's algorithm written out, and the host transforms against NumPy."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import netcl as nc
from netcl.data import DataLoader, Dataset, DistributedSampler, TensorDataset
from netcl.data import transforms as T


def _loader_threads():
    return [t for t in threading.enumerate() if t.name == "netcl-data-loader"]


@pytest.mark.parametrize("n,batch,drop_last", [(1, 1, False), (37, 8, False), (37, 8, True), (31, 7, False),
                                               (13, 13, True)])
def test_loader_covers_the_seeded_permutation_in_guarded_buffers(device, rng, canaries, n, batch, drop_last):
    images = rng.integers(0, 256, size=(n, 5, 7), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).astype(np.int64)
    loader = DataLoader(TensorDataset(images, labels), batch_size=batch, shuffle=True, drop_last=drop_last,
                        seed=11, device=device)
    steps = n // batch if drop_last else -(-n // batch)
    assert len(loader) == steps
    loader.set_epoch(3)
    batches = [(x.to_host(), y.to_host()) for x, y in loader]
    assert len(batches) == steps and loader.epoch == 4
    order = np.random.default_rng([11, 3]).permutation(n)[:steps * batch if drop_last else n]
    xs = np.concatenate([x for x, _ in batches])
    ys = np.concatenate([y for _, y in batches])
    assert xs.dtype == np.int32 and ys.dtype == np.int64, "uint8 pixels arrive as int32 values, nothing scaled"
    assert np.array_equal(xs[:, 0], images[order]) and np.array_equal(ys, labels[order])
    loader.set_epoch(3)
    assert np.array_equal(np.concatenate([y.to_host() for _, y in loader]), ys), "an epoch replays exactly"


def test_unshuffled_loader_and_epoch_advance(device):
    data = TensorDataset(np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1), np.arange(10))
    loader = DataLoader(data, batch_size=4, device=device)
    first = [y.to_host().tolist() for _, y in loader]
    assert first == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and loader.epoch == 1
    shuffled = DataLoader(data, batch_size=10, shuffle=True, seed=2, device=device)
    a = next(iter(shuffled))[1].to_host()
    for _ in shuffled:  # a full pass moves to the next epoch's permutation
        pass
    b = next(iter(shuffled))[1].to_host()
    assert sorted(a.tolist()) == list(range(10)) and not np.array_equal(a, b)


def test_seed_defaults_to_netcl_random(device):
    data = TensorDataset(np.zeros((50, 1, 1, 1), np.float32), np.arange(50))
    nc.manual_seed(7)
    a = DataLoader(data, batch_size=50, shuffle=True, device=device)
    nc.manual_seed(7)
    b = DataLoader(data, batch_size=50, shuffle=True, device=device)
    assert a.seed == b.seed
    assert np.array_equal(next(iter(a))[1].to_host(), next(iter(b))[1].to_host())


class _Squares(Dataset):
    """A map-style dataset without get_batch: samples collated by the default path."""

    def __init__(self, n, fail_at=None):
        self.n, self.fail_at = n, fail_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(f"sample {i} is unreadable")
        return np.full((2, 3), i * i, np.float32), np.int64(i)


def test_generic_dataset_and_index_list_sampler(device, canaries):
    loader = DataLoader(_Squares(9), batch_size=2, sampler=[8, 1, 4], device=device)
    out = [(x.to_host(), y.to_host()) for x, y in loader]
    assert [y.tolist() for _, y in out] == [[8, 1], [4]]
    assert np.array_equal(out[0][0], np.stack([np.full((2, 3), 64.0), np.full((2, 3), 1.0)]).astype(np.float32))
    with pytest.raises(nc.ShapeError, match="sampler"):
        DataLoader(_Squares(3), sampler=[0], shuffle=True)
    with pytest.raises(nc.ShapeError, match="batch_size"):
        DataLoader(_Squares(3), batch_size=0)
    with pytest.raises(nc.ShapeError, match=r"\(5,\)"):
        TensorDataset(np.zeros((4, 2, 2)), np.zeros(5))


def test_worker_exception_reaches_the_consumer_and_early_exit_stops_the_worker(device):
    loader = DataLoader(_Squares(40, fail_at=13), batch_size=4, device=device)
    seen = []
    with pytest.raises(KeyError, match="sample 13"):
        for _, y in loader:
            seen.append(y)
    assert len(seen) == 2, "batches before the failing one arrive; the failure stops the loop"  # 13 is in batch 3
    assert not _loader_threads()
    big = DataLoader(_Squares(400), batch_size=2, device=device, prefetch=1)
    for k, _ in enumerate(big):
        if k == 1:
            break  # the worker is blocked on its full queue: leaving must still stop it
    assert not _loader_threads()
    it = iter(big)
    next(it)
    del it
    assert not _loader_threads()


def test_upload_events_are_released_once_complete(device):
    loader = DataLoader(_Squares(64), batch_size=2, device=device)
    for _ in loader:
        pass
    device.queue.finish()
    next(iter(loader))
    assert len(loader._uploads_in_flight) <= 4  # the finished ones were let go; only recent ones remain


def _torch_distributed_shard(n, replicas, rank, perm, drop_last):
    """torch.utils.data.distributed.DistributedSampler.__iter__, written out on a given permutation."""
    indices = list(perm)
    if drop_last and n % replicas:
        num_samples = -(-(n - replicas) // replicas)
    else:
        num_samples = -(-n // replicas)
    total = num_samples * replicas
    if not drop_last:
        pad = total - len(indices)
        if pad <= len(indices):
            indices += indices[:pad]
        else:
            indices += (indices * -(-pad // len(indices)))[:pad]
    else:
        indices = indices[:total]
    return indices[rank:total:replicas]


@pytest.mark.parametrize("n", [1, 7, 13, 31])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_matches_pytorch(n, replicas, drop_last):
    data = list(range(n))
    shards = []
    for rank in range(replicas):
        s = DistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=True, seed=5, drop_last=drop_last)
        s.set_epoch(2)
        perm = np.random.default_rng([5, 2]).permutation(n).tolist()
        expected = _torch_distributed_shard(n, replicas, rank, perm, drop_last)
        assert list(s) == expected and len(s) == len(expected)
        shards.append(expected)
    if drop_last:
        flat = sum(shards, [])
        assert len(set(flat)) == len(flat), "with drop_last the shards are disjoint"
    else:
        assert set(sum(shards, [])) == set(range(n)), "every sample is seen by some rank"


def test_distributed_sampler_epochs_and_errors():
    s = DistributedSampler(list(range(20)), num_replicas=2, rank=1, seed=3)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first
    s.set_epoch(0)
    assert list(s) == first
    ordered = DistributedSampler(list(range(5)), num_replicas=2, rank=0, shuffle=False)
    assert list(ordered) == [0, 2, 4]
    with pytest.raises(nc.ShapeError, match="rank"):
        DistributedSampler(list(range(5)), num_replicas=2, rank=2)


def test_loader_set_epoch_reaches_a_distributed_sampler(device):
    data = TensorDataset(np.zeros((21, 1, 1, 1), np.float32), np.arange(21))
    sampler = DistributedSampler(data, num_replicas=3, rank=2, seed=1)
    loader = DataLoader(data, batch_size=4, sampler=sampler, device=device)
    assert len(loader) == 2
    loader.set_epoch(4)
    got = np.concatenate([y.to_host() for _, y in loader])
    assert got.tolist() == np.random.default_rng([1, 4]).permutation(21)[2::3].tolist()


# ---- transforms ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 7, 5), (4, 3, 7, 5), (1, 1, 13, 1)])
def test_normalize_per_channel(rng, shape):
    x = rng.integers(0, 256, size=shape, dtype=np.uint8)
    channels = shape[-3]
    mean = rng.uniform(0, 200, size=channels)
    std = rng.uniform(10, 90, size=channels)
    out = T.Normalize(mean, std)(x)
    ref = (x.astype(np.float64) - mean.reshape(-1, 1, 1)) / std.reshape(-1, 1, 1)
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    scaled = T.Normalize(0.1307, 0.3081, scale=1 / 255)(x)
    np.testing.assert_allclose(scaled, (x / 255.0 - 0.1307) / 0.3081, rtol=1e-5, atol=1e-5)
    with pytest.raises(nc.ShapeError, match="channel"):
        T.Normalize([0.0] * (channels + 1), 1.0)(x)
    with pytest.raises(nc.ShapeError, match="positive"):
        T.Normalize(0.0, 0.0)


@pytest.mark.parametrize("padding,expected", [(2, (2, 2, 2, 2)), ((1, 3), (1, 3, 1, 3)), ((1, 2, 3, 4), (1, 2, 3, 4))])
def test_pad_widths_and_modes(rng, padding, expected):
    x = rng.integers(0, 9, size=(2, 5, 7)).astype(np.float32)
    left, top, right, bottom = expected
    out = T.Pad(padding, fill=7)(x)
    ref = np.full((2, 5 + top + bottom, 7 + left + right), 7, np.float32)
    ref[:, top:top + 5, left:left + 7] = x
    assert np.array_equal(out, ref)
    batch = rng.integers(0, 9, size=(3, 2, 5, 7))
    assert np.array_equal(T.Pad(padding, padding_mode="reflect")(batch),
                          np.pad(batch, [(0, 0), (0, 0), (top, bottom), (left, right)], mode="reflect"))


def test_random_crop_cuts_windows_of_the_padded_image(rng):
    batch = rng.integers(1, 256, size=(31, 1, 7, 9), dtype=np.uint8)
    crop = T.RandomCrop((7, 9), padding=2)
    out = crop(batch, np.random.default_rng(4))
    assert out.shape == batch.shape and out.dtype == np.uint8
    padded = np.pad(batch, [(0, 0), (0, 0), (2, 2), (2, 2)])
    offsets = []
    for k in range(len(batch)):
        found = [(i, j) for i in range(5) for j in range(5) if np.array_equal(padded[k, :, i:i + 7, j:j + 9], out[k])]
        assert found, f"image {k} is not a window of its padded input"
        offsets.append(found[0])
    assert len(set(offsets)) > 5, "each image draws its own offset"
    assert np.array_equal(crop(batch, np.random.default_rng(4)), out), "the generator decides everything"
    single = T.RandomCrop(5)(batch[0], np.random.default_rng(0))
    assert single.shape == (1, 5, 5)
    with pytest.raises(nc.ShapeError, match="RandomCrop"):
        T.RandomCrop(12)(batch)


def test_random_horizontal_flip_and_compose(rng):
    batch = rng.uniform(-1, 1, size=(64, 2, 3, 5)).astype(np.float32)
    before = batch.copy()
    assert np.array_equal(T.RandomHorizontalFlip(0.0)(batch, rng), batch)
    assert np.array_equal(T.RandomHorizontalFlip(1.0)(batch, rng), batch[..., ::-1])
    mixed = T.RandomHorizontalFlip(0.5)(batch, rng)
    flipped = [np.array_equal(m, b[..., ::-1]) for m, b in zip(mixed, batch)]
    kept = [np.array_equal(m, b) for m, b in zip(mixed, batch)]
    assert all(f or k for f, k in zip(flipped, kept)) and 10 < sum(flipped) < 54
    pipeline = T.Compose([T.Pad(1), T.RandomCrop((3, 5)), lambda x: x * 2, T.Normalize(0.5, 2.0)])
    out = pipeline(batch, np.random.default_rng(1))
    assert out.shape == batch.shape and np.array_equal(batch, before), "transforms never write their input"


def test_augmented_batches_replay_from_seed_and_epoch(device):
    images = np.random.default_rng(0).integers(0, 256, size=(20, 28, 28), dtype=np.uint8)
    augment = T.Compose([T.Pad(2), T.RandomCrop(32, padding=2), T.RandomHorizontalFlip()])

    def epoch_batches(loader, epoch):
        loader.set_epoch(epoch)
        return [x.to_host() for x, _ in loader]
    a = DataLoader(TensorDataset(images, np.arange(20), augment), batch_size=6, shuffle=True, seed=9, device=device)
    b = DataLoader(TensorDataset(images, np.arange(20), augment), batch_size=6, shuffle=True, seed=9, device=device)
    first = epoch_batches(a, 1)
    assert all(np.array_equal(p, q) for p, q in zip(first, epoch_batches(b, 1)))
    assert not all(np.array_equal(p, q) for p, q in zip(first, epoch_batches(b, 2)))
    assert first[0].shape == (6, 1, 32, 32)


def test_batch_loader_is_a_thin_alias(device):
    images = np.arange(4 * 28 * 28, dtype=np.uint8).reshape(4, 28, 28)
    loader = nc.data.BatchLoader(images, np.arange(4), 2, shuffle=False, device=device)
    x, y = next(iter(loader))
    assert np.array_equal(x.to_host()[:, 0], images[:2]) and y.to_host().tolist() == [0, 1]


def test_uploads_are_enqueued_behind_running_work_without_waiting(device):
    """While a long kernel occupies the in-order queue, the loader still hands out batches: their uploads
    are queued behind it (not yet complete), so the host did not wait for them."""
    import pyopencl as cl
    program = cl.Program(device.context, """
        __kernel void spin(__global float* a, const int n) {
            float x = a[get_global_id(0)];
            for (int i = 0; i < n; i++) x = x * 1.0000001f + 0.5f;
            a[get_global_id(0)] = x;
        }""").build()
    spin = cl.Kernel(program, "spin")
    scratch = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 1024 * 4)
    loader = DataLoader(_Squares(8), batch_size=2, device=device)
    device.queue.finish()
    spin.set_args(scratch, np.int32(500_000))  # a few tenths of a second on two CPU cores
    busy = cl.enqueue_nd_range_kernel(device.queue, spin, (1024,), None)
    x, y = next(iter(loader))
    if busy.command_execution_status == cl.command_execution_status.COMPLETE:
        pytest.skip("the spinning kernel finished before the check (an unusually fast device)")
    assert any(e.command_execution_status != cl.command_execution_status.COMPLETE
               for e in loader._uploads_in_flight), "the batch's upload was waited for"
    device.queue.finish()
    assert np.array_equal(y.to_host(), [0, 1]) and np.array_equal(x.to_host()[1], np.full((2, 3), 1.0))


def test_a_duck_typed_dataset_is_collated_too(device):
    """Any object with __len__ and __getitem__ serves (PyTorch's map-style protocol), not only subclasses."""
    class Pairs:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.array([i, -i], np.float32), i

    batches = [(x.to_host(), y.to_host()) for x, y in DataLoader(Pairs(), batch_size=3, device=device)]
    assert [y.tolist() for _, y in batches] == [[0, 1, 2], [3, 4]]
    assert np.array_equal(batches[1][0], [[3, -3], [4, -4]]) and batches[1][1].dtype == np.int64
