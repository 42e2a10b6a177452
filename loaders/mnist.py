"""MNIST idx files (raw or .gz, inflated within the size the header declares) -> MnistDataView of float32
[1, rows, cols] images and int64 labels."""

from __future__ import annotations

import contextlib
import copy
import gzip
import math
import os
import struct
import zlib

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .imagelayout import folder_hint
from .limits import IDX_GZ_MAX_BYTES, allocate, limit_argument, read_into, size_text
from .views import IDataView, check_finite, check_labels

GZIP_MAGIC = b"\x1f\x8b"
# the idx format (yann.lecun.com/exdb/mnist): 0x00 0x00, a type byte, the number of dimensions, then each
# dimension as a big-endian uint32, then the data in C order, big-endian
IDX_TYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_HINT = (
    "idx files start with two zero bytes, a type byte (0x08 = unsigned bytes) and the number of dimensions: "
    "00 00 08 03 (0x00000803) for MNIST images, 00 00 08 01 (0x00000801) for labels"
)
SPLIT_PREFIX = {"train": "train", "test": "t10k"}
_GUESS = {1: ": labels", 3: ": images"}


def is_gzip(path: str | os.PathLike) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def idx_header(head: bytes) -> tuple[np.dtype, tuple[int, ...]] | None:
    """(dtype, dims) when `head` (the first bytes of a file, at least 4 + 4 * ndim) is an idx header."""
    if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in IDX_TYPES or not 1 <= head[3] <= 8:
        return None
    nd = head[3]
    if len(head) < 4 + 4 * nd:
        return None
    return IDX_TYPES[head[2]], struct.unpack(f">{nd}I", head[4 : 4 + 4 * nd])


def _describe_start(head: bytes) -> str:
    shown = " ".join(f"{b:02x}" for b in head[:4])
    text = head[:16].decode("latin-1")
    if head and all(32 <= ord(c) < 127 or c in "\r\n\t" for c in text):
        shown += f" (text {text!r}: a web page or an error message instead of the data?)"
    elif len(head) >= 4:
        shown += f" (0x{int.from_bytes(head[:4], 'big'):08x})"
    return shown or "nothing (the file is empty)"


def _gzip_stream(path: str):
    try:
        return gzip.open(path, "rb")
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})", path) from e


def _read_head(f) -> bytes:
    """The idx header from the start of a stream: 4 bytes, then 4 per dimension (fewer when the stream ends)."""
    head = f.read(4)
    if len(head) == 4 and head[0] == 0 and head[1] == 0 and head[2] in IDX_TYPES and 1 <= head[3] <= 8:
        head += f.read(4 * head[3])
    return head


def read_idx(
    path: str | os.PathLike,
    *,
    ndim: int | None = None,
    what: str = "data",
    max_bytes: int = IDX_GZ_MAX_BYTES,
) -> np.ndarray:
    """The array in an idx file, raw (memory-mapped, read lazily) or gzip-compressed (inflated in memory).

    `ndim` checks the number of dimensions; `what` ("images", "labels") words the error messages. A .gz file is
    inflated into a buffer of exactly the size its header declares, which must be at most `max_bytes` (default
    IDX_GZ_MAX_BYTES, 1 GiB: DataLimitError beyond); a stream that holds more than declared is refused as soon as
    one byte more comes (DataLimitError), one that holds less is truncated (DataError). Float data must be
    finite (DataError naming the first sample that is not).
    """
    path = os.fspath(path)
    max_bytes = limit_argument(max_bytes)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file ({what})", path)
    try:
        compressed = is_gzip(path)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})", path) from e
    with contextlib.ExitStack() as stack:
        try:
            if compressed:
                f = stack.enter_context(_gzip_stream(path))
            else:
                f = stack.enter_context(open(path, "rb"))
            head = _read_head(f)
            dtype, dims, offset, expected = _check_head(path, head, ndim, what)
            nbytes = expected - offset
            shape = " x ".join(map(str, dims))
            if not compressed:
                actual = os.path.getsize(path)
                _check_raw_size(path, what, shape, dtype, expected, actual)
                if dims[0] == 0:
                    raise DataError(f"{path}: empty dataset (the idx header counts 0 {what})", path)
                try:
                    out = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=dims)
                except (ValueError, OverflowError) as e:  # mmap refuses (e.g. beyond the address space)
                    raise DataError(f"{path}: cannot memory-map the {what} ({shape}): {e}", path) from e
            else:
                if dims[0] == 0:
                    raise DataError(f"{path}: empty dataset (the idx header counts 0 {what})", path)
                if nbytes > max_bytes:
                    raise DataLimitError(
                        f"{path}: the idx header declares {shape} {dtype.name} values, {size_text(nbytes)} once "
                        f"inflated, more than the {size_text(max_bytes)} allowed for a .gz file; refused before "
                        f"inflating it (a decompression bomb, or a dataset too large for memory: pass "
                        f"max_bytes= to allow more, or decompress it to disk, where it is memory-mapped)",
                        path,
                        limit=max_bytes,
                        needed=nbytes,
                    )
                buf = allocate(nbytes, path, f"the {what} ({shape} {dtype.name} values)")
                got = read_into(f, buf)
                if got < nbytes:
                    raise DataError(
                        f"{path}: truncated {what}: the header says {shape} {dtype.name} values, {expected} bytes "
                        f"in all once decompressed, but the file has {offset + got} bytes once decompressed",
                        path,
                    )
                if f.read(1):
                    raise DataLimitError(
                        f"{path}: inflates to more than its idx header declares ({shape} {dtype.name} values, "
                        f"{expected} bytes expected once decompressed): a damaged file or a decompression "
                        f"bomb; refused at the declared size",
                        path,
                        limit=expected,
                        needed=expected + 1,
                    )
                out = buf.view(dtype).reshape(dims)
        except (OSError, EOFError, zlib.error) as e:
            if compressed:
                raise DataError(f"{path}: a damaged or truncated gzip file ({e})", path) from e
            raise DataError(f"{path}: cannot read ({e})", path) from e
    if dtype.kind == "f":
        check_finite(out, path, what="value")
    return out


def _check_head(path: str, head: bytes, ndim: int | None, what: str):
    """(dtype, dims, data offset, expected total size) of an idx header, or the DataError that says what is wrong."""
    parsed = idx_header(head)
    if parsed is None:
        if len(head) >= 4 and head[0] == 0 and head[1] == 0 and head[2] in IDX_TYPES and 1 <= head[3] <= 8:
            raise DataError(
                f"{path}: truncated idx header: {head[3]} dimensions need {4 + 4 * head[3]} bytes, "
                f"the file has {len(head)}",
                path,
            )
        raise DataError(
            f"{path}: not an idx {what} file: it starts with {_describe_start(head)}; {_IDX_HINT}", path
        )
    dtype, dims = parsed
    if ndim is not None and len(dims) != ndim:
        raise DataError(
            f"{path}: expected {what} with {ndim} dimension(s) (magic 0x0000{head[2]:02x}{ndim:02x}), found "
            f"{len(dims)} dimensions {list(dims)} (magic 0x{int.from_bytes(head[:4], 'big'):08x}"
            f"{_GUESS.get(len(dims), '')}; images and labels swapped?)",
            path,
        )
    offset = 4 + 4 * len(dims)
    return dtype, dims, offset, offset + math.prod(dims) * dtype.itemsize


def _check_raw_size(path: str, what: str, shape: str, dtype: np.dtype, expected: int, actual: int) -> None:
    if actual < expected:
        raise DataError(
            f"{path}: truncated {what}: the header says {shape} {dtype.name} values, {expected} bytes in all, "
            f"but the file has {actual} bytes",
            path,
        )
    if actual > expected:
        raise DataError(
            f"{path}: {actual - expected} bytes after the {what} data ({shape} {dtype.name} values, "
            f"{expected} bytes expected): not a clean idx file",
            path,
        )


class MnistDataView(IDataView):
    """MNIST-format images and labels: x is float32 [1, rows, cols], y an int64 scalar.

    normalize=True (the default) scales pixels to [0, 1] (x / 255); False keeps 0..255 as float32; a pair
    (mean, std) gives (x / 255 - mean) / std, e.g. (0.1307, 0.3081) for MNIST. Raw files are memory-mapped
    and each batch reads only its images; .gz files are decompressed into memory once, within the size their
    header declares and `max_bytes` (see read_idx). Labels must lie in [0, num_classes) (num_classes=None skips
    the check).
    """

    finite_checked = True  # uint8 pixels

    def __init__(
        self,
        images_path: str | os.PathLike,
        labels_path: str | os.PathLike,
        *,
        normalize: bool | tuple[float, float] = True,
        num_classes: int | None = 10,
        max_bytes: int = IDX_GZ_MAX_BYTES,
    ):
        mean_std = _normalize_argument(normalize)
        images = read_idx(images_path, ndim=3, what="images", max_bytes=max_bytes)
        labels = read_idx(labels_path, ndim=1, what="labels", max_bytes=max_bytes)
        self.source = os.fspath(images_path)
        if images.dtype != np.uint8:
            raise DataError(
                f"{images_path}: MNIST images are unsigned bytes (type 0x08), found {images.dtype}"
            )
        if labels.dtype.kind not in "iu":
            raise DataError(
                f"{labels_path}: labels must be integers, found {labels.dtype}", os.fspath(labels_path)
            )
        if images.shape[0] != labels.shape[0]:
            raise DataError(
                f"{images_path} holds {images.shape[0]} images but {labels_path} holds {labels.shape[0]} labels",
                self.source,
            )
        self.images = images  # uint8 [n, rows, cols], a np.memmap for raw files
        self._labels = np.asarray(labels).astype(np.int64)
        self._mean_std = mean_std
        self.normalize = normalize
        if num_classes is not None:
            check_labels(self, num_classes)

    def raw(self) -> MnistDataView:
        """The same samples as their 0..255 values (float32), for an input pipeline that scales them itself."""
        view = copy.copy(self)
        view.normalize, view._mean_std = False, None
        return view

    @classmethod
    def from_dir(cls, directory: str | os.PathLike, split: str = "train", **kwargs) -> MnistDataView:
        """The `split` ("train" or "test") of an MNIST directory: {train,t10k}-{images-idx3,labels-idx1}-ubyte,
        raw or .gz (the raw file when both are there)."""
        images, labels = find_mnist_files(directory, split)
        return cls(images, labels, **kwargs)

    def _convert(self, raw: np.ndarray) -> np.ndarray:
        x = np.asarray(raw, dtype=np.float32)[:, None]  # [b, rows, cols] -> [b, 1, rows, cols]
        if self.normalize is False:
            return x
        x /= np.float32(255)  # correctly rounded division: 255 -> exactly 1.0
        if self._mean_std is not None:
            x -= self._mean_std[0]
            x /= self._mean_std[1]
        return x

    def get_item(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        return self._convert(self.images[idx : idx + 1])[0], self._labels[idx, ...]

    def size(self) -> int:
        return int(self._labels.shape[0])

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._convert(self.images[np.asarray(indices)]), np.take(self._labels, indices)

    def labels(self) -> np.ndarray:
        return self._labels


def _normalize_argument(normalize) -> tuple[np.float32, np.float32] | None:
    """MnistDataView's normalize= -> None (True, False) or (mean, std) as float32 (ConfigError unless std > 0)."""
    if isinstance(normalize, (bool, np.bool_)):
        return None
    try:
        mean, std = (float(v) for v in normalize)
    except (TypeError, ValueError):
        mean = std = math.nan
    fits = math.isfinite(mean) and math.isfinite(std) and std > 0
    # (x / 255 - mean) / std for x in 0..255 must stay a finite float32
    if not (fits and (1 + abs(mean)) / std < float(np.finfo(np.float32).max) and abs(mean) < 1e38):
        raise ConfigError(
            f"MnistDataView normalize must be True, False or a pair (mean, std) of finite numbers with std > 0 "
            f"(e.g. (0.1307, 0.3081)), got {normalize!r}"
        )
    return np.float32(mean), np.float32(std)


def mnist_names(split: str, kind: str) -> list[str]:
    """File names an MNIST `split` file of `kind` ("images" or "labels") goes by, raw names first."""
    if split not in SPLIT_PREFIX:
        raise ConfigError(f"MNIST split must be one of {sorted(SPLIT_PREFIX)}, got {split!r}")
    stem = f"{SPLIT_PREFIX[split]}-{kind}"
    idx = "idx3-ubyte" if kind == "images" else "idx1-ubyte"
    bases = [f"{stem}-{idx}", f"{stem}.{idx}"]  # yann.lecun.com's names; some mirrors use a dot
    return bases + [b + ".gz" for b in bases]


def find_mnist_files(directory: str | os.PathLike, split: str = "train") -> tuple[str, str]:
    """Paths of the images and labels files of `split` in `directory` (DataError when either is missing)."""
    directory = os.fspath(directory)
    found = []
    for kind in ("images", "labels"):
        names = mnist_names(split, kind)
        path = next(
            (os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))), None
        )
        if path is None:
            have = sorted(os.listdir(directory)) if os.path.isdir(directory) else None
            more = " ..." if have and len(have) > 10 else ""
            held = "it is not a directory" if have is None else f"it holds {have[:10]}{more}"
            images = folder_hint(directory) if have else ""  # images: point to their layout, not to idx names
            if images:
                raise DataError(f"{directory}: not an MNIST directory{images}", directory)
            raise DataError(
                f"{directory}: no MNIST {split} {kind} file (looked for {', '.join(names)}); {held}",
                directory,
            )
        found.append(path)
    return found[0], found[1]
