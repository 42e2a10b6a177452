"""Datasets -> batches for on-device training: views, readers, sample adapters, preprocessing and a resumable
DataLoader (numpy only).

This package never imports edgetrain, onnx or onnxruntime: it runs on a device with numpy alone.
"""

from .adapt import SampleAdapter, adapt_samples
from .csvtable import CsvDataView
from .detect import open_data
from .digest import fingerprint
from .errors import ConfigError, DataError, DataLimitError, SampleIndexError
from .limits import CSV_MAX_BYTES, IDX_GZ_MAX_BYTES, NPZ_MAX_BYTES, NPZ_MAX_MEMBERS
from .loader import DataLoader
from .mnist import MnistDataView, read_idx
from .npz import NpzDataView, read_npz
from .preprocess import Preprocess, parse_normalize, parse_scale
from .store import SampleStore, StoreView, split_score
from .views import ArrayDataView, IDataView, SubsetView, check_finite, check_labels, split

__all__ = [
    "CSV_MAX_BYTES",
    "IDX_GZ_MAX_BYTES",
    "NPZ_MAX_BYTES",
    "NPZ_MAX_MEMBERS",
    "ArrayDataView",
    "ConfigError",
    "CsvDataView",
    "DataError",
    "DataLimitError",
    "DataLoader",
    "IDataView",
    "MnistDataView",
    "NpzDataView",
    "Preprocess",
    "SampleAdapter",
    "SampleIndexError",
    "SampleStore",
    "StoreView",
    "SubsetView",
    "adapt_samples",
    "check_finite",
    "check_labels",
    "fingerprint",
    "open_data",
    "parse_normalize",
    "parse_scale",
    "read_idx",
    "read_npz",
    "split",
    "split_score",
]
