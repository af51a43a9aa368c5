"""Data: Dataset, TensorDataset, DataLoader (background preparation, non-blocking uploads), samplers
(DistributedSampler), host-side transforms, and MNIST (nc.data.mnist.load_mnist)."""
from . import mnist, transforms
from .dataset import Dataset, TensorDataset
from .loader import BatchLoader, DataLoader
from .sampler import DistributedSampler, Sampler

__all__ = ["mnist", "transforms", "Dataset", "TensorDataset", "DataLoader", "Sampler", "DistributedSampler",
           "BatchLoader"]
