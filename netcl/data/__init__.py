"""Datasets and batch loading: nc.data.mnist.load_mnist, nc.data.BatchLoader."""
from . import mnist
from .loader import BatchLoader

__all__ = ["mnist", "BatchLoader"]
