"""Datasets -> batches for on-device training: views, readers, sample adapters, preprocessing and a resumable
DataLoader (numpy only).

This package never imports edgetrain, onnx or onnxruntime: it runs on a device with numpy alone.
"""

from .adapt import SampleAdapter, adapt_samples
from .detect import open_data
from .digest import fingerprint
from .errors import DataError
from .files import CsvDataView, NpzDataView
from .loader import DataLoader
from .mnist import MnistDataView, read_idx
from .preprocess import Preprocess, parse_normalize, parse_scale
from .store import SampleStore, StoreView, split_score
from .views import ArrayDataView, IDataView, SubsetView, check_labels, split

__all__ = [
    "ArrayDataView",
    "CsvDataView",
    "DataError",
    "DataLoader",
    "IDataView",
    "MnistDataView",
    "NpzDataView",
    "Preprocess",
    "SampleAdapter",
    "SampleStore",
    "StoreView",
    "SubsetView",
    "adapt_samples",
    "check_labels",
    "fingerprint",
    "open_data",
    "parse_normalize",
    "parse_scale",
    "read_idx",
    "split",
    "split_score",
]
