"""Datasets -> batches for on-device training: views, readers (image folders and lists among them), sample
adapters, preprocessing, augmentation, text (a word vocabulary, token windows for next-token training) and a
resumable DataLoader (numpy only; Pillow, optional, decodes images).

This package never imports edgetrain, onnx or onnxruntime: it runs on a device with numpy alone.
"""

from . import imageops
from .adapt import SampleAdapter, adapt_samples
from .augment import Augment
from .csvtable import CsvDataView
from .detect import open_data
from .digest import fingerprint
from .errors import ConfigError, DataError, DataLimitError, SampleIndexError
from .imagedecode import IMAGE_MAX_BYTES, IMAGE_MAX_PIXELS, read_image
from .imagelists import ImageListView
from .images import ImageFilesView, ImageFolderView
from .limits import CSV_MAX_BYTES, IDX_GZ_MAX_BYTES, NPZ_MAX_BYTES, NPZ_MAX_MEMBERS
from .loader import DataLoader
from .mnist import MnistDataView, read_idx
from .npz import NpzDataView, read_npz
from .pipeline import DataFacts, InputPipeline, data_facts, parse_range
from .preprocess import Preprocess, parse_normalize, parse_scale
from .store import SampleStore, StoreView, split_score
from .text import TokenWindowView, WordVocab
from .views import ArrayDataView, IDataView, SubsetView, check_finite, check_labels, split

__all__ = [
    "CSV_MAX_BYTES",
    "IMAGE_MAX_BYTES",
    "IMAGE_MAX_PIXELS",
    "IDX_GZ_MAX_BYTES",
    "NPZ_MAX_BYTES",
    "NPZ_MAX_MEMBERS",
    "ArrayDataView",
    "Augment",
    "ConfigError",
    "CsvDataView",
    "DataError",
    "DataFacts",
    "DataLimitError",
    "DataLoader",
    "IDataView",
    "ImageFilesView",
    "ImageFolderView",
    "ImageListView",
    "InputPipeline",
    "MnistDataView",
    "NpzDataView",
    "Preprocess",
    "SampleAdapter",
    "SampleIndexError",
    "SampleStore",
    "StoreView",
    "SubsetView",
    "TokenWindowView",
    "WordVocab",
    "adapt_samples",
    "check_finite",
    "check_labels",
    "data_facts",
    "fingerprint",
    "imageops",
    "open_data",
    "parse_normalize",
    "parse_range",
    "parse_scale",
    "read_idx",
    "read_image",
    "read_npz",
    "split",
    "split_score",
]
