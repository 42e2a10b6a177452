"""Datasets -> batches for on-device training: views, readers and a resumable DataLoader (numpy only).

This package never imports edgetrain, onnx or onnxruntime: it runs on a device with numpy alone.
"""

from .detect import open_data
from .errors import DataError
from .files import CsvDataView, NpzDataView
from .loader import DataLoader
from .mnist import MnistDataView, read_idx
from .views import ArrayDataView, IDataView, SubsetView, check_labels, split

__all__ = [
    "ArrayDataView",
    "CsvDataView",
    "DataError",
    "DataLoader",
    "IDataView",
    "MnistDataView",
    "NpzDataView",
    "SubsetView",
    "check_labels",
    "open_data",
    "read_idx",
    "split",
]
