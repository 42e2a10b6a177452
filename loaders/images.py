"""Image files as people keep them (ROOT/<class>/*.png|jpg|..., or a CSV/JSON list of path,label) -> IDataViews of
uint8 [H, W, C] samples, decoded lazily per batch with Pillow (an optional dependency): ImageFolderView,
ImageListView, read_image."""

from __future__ import annotations

import csv
import io
import json
import numbers
import os
import re
import struct

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .imageops import center_crop, resize, size_pair
from .limits import CSV_MAX_BYTES, limit_argument, size_text
from .views import IDataView, check_labels, class_count

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
# files a class folder may hold beside its images, ignored: notes and metadata people keep with their pictures, and
# the files Windows drops into folders it shows (macOS's .DS_Store is hidden, as every name starting with a dot is)
SIDECAR_EXTENSIONS = (".txt", ".json")
SIDECAR_NAMES = ("thumbs.db", "desktop.ini")
# the largest image decoded: 64 Mi pixels (8192 x 8192; a 50-megapixel photo fits), 192 MiB as RGB; the size is
# read from the file's header and checked before its pixels are decoded (a decompression bomb is refused)
IMAGE_MAX_PIXELS = 1 << 26
# what Pillow may decode (its JPEG reader also opens cameras' multi-picture JPEGs); never its other plugins (EPS
# runs Ghostscript), whatever a file's name says
_PILLOW_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP")
_SPLIT_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing", "eval")
_PATH_COLUMNS = ("path", "file", "filename", "file_name", "filepath", "image", "image_path", "img")
_LABEL_COLUMNS = ("label", "labels", "class", "target", "y", "category")
_INSTALL = (
    "reading images needs Pillow, which is not installed here: pip install 'edgetrain[images]' (or convert the "
    "images to an .npz on a workstation: np.savez(path, x=images, y=labels))"
)


def image_kind(head: bytes) -> str | None:
    """'a PNG image' (JPEG, GIF, BMP, WebP) when `head`, a file's first bytes, starts like one, else None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "a PNG image"
    if head.startswith(b"\xff\xd8\xff"):
        return "a JPEG image"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "a GIF image"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    # "BM" then, at byte 14, the size of one of the DIB headers (so that a text file starting "BM" is not one)
    if (
        head[:2] == b"BM"
        and len(head) >= 18
        and struct.unpack("<I", head[14:18])[0] in (12, 40, 52, 56, 64, 108, 124)
    ):
        return "a BMP image"
    return None


def _hidden(name: str) -> bool:
    # dot files (.DS_Store, macOS's ._ resource forks, .ipynb_checkpoints) and the folder macOS's zip adds
    return name.startswith(".") or name == "__MACOSX"


def is_image_name(name: str) -> bool:
    """Whether a file name ends with an image extension (any case)."""
    return name.strip().lower().endswith(IMAGE_EXTENSIONS)


def _sidecar(name: str) -> bool:
    low = name.lower()
    return low in SIDECAR_NAMES or low.endswith(SIDECAR_EXTENSIONS)


# -- the layout of a directory ------------------------------------------------------------------------------------
def _listing(directory: str) -> tuple[list[str], list[str]]:
    """(visible subfolders, visible files) of a directory, sorted."""
    try:
        with os.scandir(directory) as it:
            entries = [(e.name, e.is_dir()) for e in it if not _hidden(e.name)]
    except OSError as e:
        raise DataError(f"{directory}: cannot list the folder ({e.strerror or e})", directory) from e
    entries.sort()
    return [n for n, d in entries if d], [n for n, d in entries if not d]


def _holds_images(folder: str, depth: int) -> bool:
    """Whether `folder` holds an image file, directly or (depth 2) in a subfolder."""
    subs, files = _listing(folder)
    if any(is_image_name(f) for f in files):
        return True
    return depth > 1 and any(_holds_images(os.path.join(folder, s), depth - 1) for s in subs)


def image_layout(directory: str) -> tuple[str, list[str]] | None:
    """How a directory holds images, looked at two folder levels deep:
    ("classes", class folders) when subfolders hold images (ROOT/<class>/...);
    ("splits", split folders) when its subfolders are all named like splits (train, val, test, ...) and hold
    class folders of images (ROOT/train/<class>/...); ("loose", image files) when it holds images but no
    subfolder does; None when it holds no image."""
    subs, files = _listing(directory)
    loose = [f for f in files if is_image_name(f)]
    split_like = subs and all(s.lower() in _SPLIT_NAMES for s in subs)
    if split_like and not loose:
        paths = [os.path.join(directory, s) for s in subs]
        if not any(_holds_images(p, 1) for p in paths) and any(_holds_images(p, 2) for p in paths):
            return "splits", subs
    with_images = [s for s in subs if _holds_images(os.path.join(directory, s), 2)]
    if with_images:
        return "classes", with_images
    return ("loose", loose) if loose else None


def folder_hint(directory: str) -> str:
    """What a directory's images need to be read, for another reader's 'not my format' message ('' when it holds
    no images)."""
    layout = image_layout(directory)
    if layout is None:
        return ""
    kind, names = layout
    if kind == "classes":
        return f"; it holds folders of images ({', '.join(names[:5])}): open_data() reads ROOT/<class>/ image folders"
    if kind == "splits":
        first = os.path.join(directory, names[0])
        return f"; it holds the splits {', '.join(names)}: open {first}, whose subfolders are the classes"
    return (
        f"; it holds {len(names)} images but no class folders: for images, the layout is "
        f"{os.path.join(directory, '<class>')}/*.png (one folder per class), or a CSV of path,label"
    )


def loose_images_message(directory: str, images: list[str]) -> str:
    """The DataError message for a directory of images without class folders."""
    shown = ", ".join(images[:3]) + (", ..." if len(images) > 3 else "")
    return (
        f"{directory}: a folder of {len(images)} images ({shown}) without class folders: one folder holds one "
        f"class; put the images in {os.path.join(directory, '<class>')}/ folders (one per class), or list them in "
        f"a CSV of path,label"
    )


def one_image_message(path: str, kind: str) -> str:
    """The DataError message for one image file given where a dataset was expected."""
    return (
        f"{path}: {kind}: one image is not a dataset; put images in ROOT/<class>/ folders (one folder per class) "
        f"and open ROOT, or list them in a CSV of path,label"
    )


# -- decoding -----------------------------------------------------------------------------------------------------
def _pillow(path: str):
    """(PIL.Image, PIL.ImageOps), or the DataError that says how to install Pillow."""
    try:
        from PIL import Image, ImageOps  # optional: only image files need Pillow (the images extra)
    except ImportError as e:
        raise DataError(f"{path}: {_INSTALL}", path) from e
    return Image, ImageOps


_WIDE_GRAY = ("I", "I;16", "I;16L", "I;16B", "I;16N")  # 16-bit grayscale PNGs (and 32-bit integer pixels)
_GRAY = ("1", "L", "LA", "La", *_WIDE_GRAY)


def _gray_palette(im) -> bool:
    palette = im.getpalette() or []
    return bool(palette) and all(
        palette[k] == palette[k + 1] == palette[k + 2] for k in range(0, len(palette) - 2, 3)
    )


def _natural_channels(im) -> int:
    """1 for a grayscale image (a palette of grays counts), 3 for anything in color."""
    return 1 if im.mode in _GRAY or (im.mode == "P" and _gray_palette(im)) else 3


def _pixels(im, channels: int | None) -> np.ndarray:
    """uint8 [H, W, C] of a loaded Pillow image: C = `channels`, or the image's own (1 or 3) when None.

    16-bit grayscale becomes 8-bit by round(v / 257) (65535 -> 255, exact for 8-bit data stored as v * 257);
    alpha is dropped (as Pillow's convert("RGB") and torchvision do); palette, CMYK and YCbCr images become RGB by
    Pillow's conversion; color becomes grayscale by Pillow's convert("L") (ITU-R 601-2 luma); grayscale becomes
    color by repeating the one channel."""
    want = channels or _natural_channels(im)
    if im.mode in _WIDE_GRAY:
        wide = np.asarray(im).astype(np.int64)
        a = ((np.clip(wide, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)
    elif _natural_channels(im) == 1:
        a = np.asarray(im if im.mode == "L" else im.convert("L"))
    else:
        if im.mode == "P" and "transparency" in im.info:
            im = im.convert("RGBA")  # Pillow's own advice for palettes with transparency
        rgb = im if im.mode == "RGB" else im.convert("RGB")
        a = np.asarray(rgb.convert("L") if want == 1 else rgb)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.shape[2] != want:  # grayscale asked as color
        a = np.repeat(a, want, axis=2)
    return np.ascontiguousarray(a, dtype=np.uint8)


_DECODE_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    KeyError,
    TypeError,
    struct.error,
    ZeroDivisionError,
    RuntimeError,
)  # what Pillow's decoders raise on damaged files


def read_image(path, *, channels: int | None = None, max_pixels: int = IMAGE_MAX_PIXELS) -> np.ndarray:
    """The pixels of one PNG, JPEG, BMP, GIF (first frame) or WebP file: uint8 [H, W, C], channels last, with the
    file's EXIF orientation applied (a phone's portrait photo comes upright). C is `channels` (1: grayscale,
    3: RGB, converted as _pixels says), or the file's own: 1 for grayscale, 3 for everything else.

    The file's declared width x height must be at most `max_pixels` (DataLimitError before decoding: a
    decompression bomb). A file that is missing, damaged, truncated or not one of these formats (by content,
    whatever its name) is a DataError naming it; without Pillow, a DataError saying how to install it."""
    path = os.fspath(path)
    max_pixels = limit_argument(max_pixels, "max_pixels")
    if channels not in (None, 1, 3):
        raise ConfigError(
            f"channels must be 1 (grayscale), 3 (RGB) or None (each file's own), got {channels!r}"
        )
    Image, ImageOps = _pillow(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such image file", path)
    try:
        with Image.open(path, formats=_PILLOW_FORMATS) as im:
            width, height = im.size
            if width * height > max_pixels:
                raise DataLimitError(
                    f"{path}: an image of {width} x {height} pixels, more than the {max_pixels} allowed; refused "
                    f"before decoding it (a decompression bomb, or a photo larger than training needs: scale it "
                    f"down, or pass max_pixels= to allow more)",
                    path,
                    limit=max_pixels,
                    needed=width * height,
                )
            im.load()
            return _pixels(ImageOps.exif_transpose(im), channels)
    except DataError:
        raise
    except Image.DecompressionBombError as e:
        raise DataLimitError(f"{path}: Pillow refuses it as a decompression bomb ({e})", path) from e
    except Image.UnidentifiedImageError as e:
        raise DataError(
            f"{path}: not an image file that is read here (PNG, JPEG, BMP, GIF, WebP, recognised by content)",
            path,
        ) from e
    except MemoryError as e:
        raise DataLimitError(f"{path}: not enough memory to decode the image ({e})", path) from e
    except _DECODE_ERRORS as e:
        raise DataError(f"{path}: a damaged or truncated image file ({e})", path) from e


# -- the views ------------------------------------------------------------------------------------------------------
class ImageFilesView(IDataView):
    """Image files and their integer class labels: sample i is (the pixels of paths[i], labels[i]), decoded when a
    batch asks for it (nothing decoded is kept). ImageFolderView and ImageListView make one from a folder or a list.

    x is uint8 [H, W, C], channels last. Without size= or crop=, every image must be the size of the first (a
    DataError at read time names both files and sizes). size=(H, W) resizes each image to exactly H x W with
    loaders.imageops.resize (bilinear, ONNX Resize's half_pixel semantics), in float32: x is then float32, still
    0..255. crop=(h, w) then center-crops (torchvision's Resize + CenterCrop); alone, it crops each image, which
    must be at least h x w. channels=1 or 3 converts every image to grayscale or RGB; None (the default) takes
    the first image's: a grayscale image among color ones is repeated to 3 channels, a color image among grayscale
    ones is a DataError that says to pass channels=. `classes` names the labels (view.classes; by default the
    label numbers as text). See read_image for the decoding rules and max_pixels.
    """

    finite_checked = True  # uint8 pixels, or a bilinear blend of them

    def __init__(
        self,
        paths,
        labels,
        *,
        classes=None,
        size=None,
        crop=None,
        channels: int | None = None,
        num_classes: int | None = None,
        max_pixels: int = IMAGE_MAX_PIXELS,
        source: str = "<image files>",
    ):
        self.source = source
        self.resize_to = None if size is None else size_pair(size, "size")
        self.crop_to = None if crop is None else size_pair(crop, "crop")
        if (
            self.resize_to
            and self.crop_to
            and (self.crop_to[0] > self.resize_to[0] or self.crop_to[1] > self.resize_to[1])
        ):
            raise ConfigError(
                f"crop={self.crop_to} is larger than size={self.resize_to}: a crop is taken from the resized image"
            )
        if channels not in (None, 1, 3):
            raise ConfigError(
                f"channels must be 1 (grayscale), 3 (RGB) or None (the first image's), got {channels!r}"
            )
        self.max_pixels = limit_argument(max_pixels, "max_pixels")
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise DataError(f"{source}: empty dataset (no image files)", source)
        y = np.asarray(labels)
        if y.shape != (len(self.paths),) or y.dtype.kind not in "iu" or (y < 0).any():
            raise ConfigError(
                f"{source}: {len(self.paths)} image paths need as many class labels, integers >= 0; got "
                f"{y.dtype} labels of shape {list(y.shape)}"
            )
        self._labels = y.astype(np.int64)
        if classes is not None and num_classes is not None and class_count(num_classes) < len(classes):
            raise DataError(
                f"{source}: {len(classes)} classes ({', '.join(map(str, classes[:10]))}) but num_classes={num_classes}",
                source,
            )
        top = max(int(self._labels.max()) + 1, 0 if num_classes is None else class_count(num_classes))
        self.classes = [str(k) for k in range(top)] if classes is None else list(classes)
        self._channels_option = channels
        self._first = None
        first = self._decode(0)
        self._first = (self.paths[0], first.shape[:2] if self.resize_to is None else None)
        self.channels = int(first.shape[2])
        self.sample_shape, self.dtype = first.shape, first.dtype
        if num_classes is not None:
            check_labels(self, num_classes)

    def _decode(self, i: int) -> np.ndarray:
        path = self.paths[i]
        a = read_image(path, channels=self._channels_option, max_pixels=self.max_pixels)
        if self._first is not None and a.shape[2] != self.channels:
            if self.channels == 1:
                raise DataError(
                    f"{path}: a color image, but {self._first[0]}, the first image, is grayscale (1 channel): pass "
                    f"channels=3 to read every image as RGB, or channels=1 to read every image as grayscale",
                    path,
                )
            a = np.repeat(a, 3, axis=2)  # grayscale among color images: exactly what channels=3 gives
        if self.resize_to is not None:
            a = resize(a, self.resize_to)
        elif self.crop_to is None and self._first is not None and a.shape[:2] != self._first[1]:
            (h, w), (fh, fw) = a.shape[:2], self._first[1]
            raise DataError(
                f"{path}: {h} x {w} pixels (H x W), but {self._first[0]}, the first image, is {fh} x {fw}: the images "
                f"of a dataset must be one size; pass size=(H, W) to resize each (or crop=(h, w) to center-crop each)",
                path,
            )
        if self.crop_to is not None:
            if a.shape[0] < self.crop_to[0] or a.shape[1] < self.crop_to[1]:
                raise DataError(
                    f"{path}: {a.shape[0]} x {a.shape[1]} pixels (H x W), smaller than crop={self.crop_to}: pass "
                    f"size=(H, W) to resize every image first, or a smaller crop",
                    path,
                )
            a = np.ascontiguousarray(center_crop(a, self.crop_to))
        return a

    def get_item(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        return self._decode(int(idx)), self._labels[idx, ...]

    def size(self) -> int:
        return len(self.paths)

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.intp)
        return np.stack([self._decode(int(i)) for i in indices]), np.take(self._labels, indices)

    def labels(self) -> np.ndarray:
        return self._labels


def _class_files(root: str, name: str) -> list[str]:
    """The image files of class folder ROOT/name, its subfolders included, in sorted order; a file that is not an
    image, nor hidden, nor a sidecar, is a DataError naming it."""
    found = []

    def refuse(e: OSError):
        raise DataError(f"{e.filename}: cannot list the folder ({e.strerror or e})", e.filename)

    for folder, subs, files in os.walk(os.path.join(root, name), onerror=refuse):
        subs[:] = sorted(s for s in subs if not _hidden(s))
        for f in sorted(files):
            if _hidden(f) or _sidecar(f):
                continue
            path = os.path.join(folder, f)
            if not is_image_name(f):
                raise DataError(
                    f"{path}: not an image ({', '.join(IMAGE_EXTENSIONS)}) in the class folder {name!r}: move it "
                    f"out of {root} (notes may stay: {', '.join(SIDECAR_EXTENSIONS)}, Thumbs.db, desktop.ini and "
                    f"hidden files are ignored)",
                    path,
                )
            found.append(path)
    return found


def _folder_classes(root: str, classes) -> tuple[list[str], bool]:
    """(the class names in label order, whether the user gave them) of an image folder."""
    subs, files = _listing(root)
    loose = [f for f in files if is_image_name(f)]
    if loose and not subs:
        raise DataError(loose_images_message(root, loose), root)
    if loose:
        raise DataError(
            f"{os.path.join(root, loose[0])}: an image directly in {root}, outside the class folders "
            f"({', '.join(subs[:5])}): it has no class; move it into {os.path.join(root, '<class>')}/",
            root,
        )
    if classes is None:
        layout = image_layout(root) if subs and all(s.lower() in _SPLIT_NAMES for s in subs) else None
        if layout is not None and layout[0] == "splits":
            raise DataError(
                f"{root}: its folders {', '.join(subs)} are splits (each a folder of class folders), not classes: "
                f"open {os.path.join(root, subs[0])}, whose subfolders are the classes",
                root,
            )
        if not subs:
            raise DataError(
                f"{root}: no class folders; the layout is {os.path.join(root, '<class>')}/*.png", root
            )
        return subs, False
    classes = _classes_argument(classes)
    extra = [s for s in subs if s not in classes]
    if extra:
        raise DataError(
            f"{root}: the folder {extra[0]!r} is not one of the classes given ({', '.join(classes[:10])}): remove it "
            f"or add it to classes=",
            root,
        )
    return classes, True


class ImageFolderView(ImageFilesView):
    """The images of ROOT/<class>/ folders, torchvision's ImageFolder layout: the classes are the subfolders'
    names, sorted (as Python sorts text: "10" before "2"), with labels 0..K-1 in that order (view.classes).

    Images are .png, .jpg, .jpeg, .bmp, .gif and .webp files (any case), in a class folder or its subfolders.
    Hidden files and folders (names starting with a dot, __MACOSX) are ignored, and so are notes kept with the
    pictures (.txt, .json) and Windows' Thumbs.db and desktop.ini; any other file in a class folder is a DataError
    naming it (a stray file is a mistake to hear about, not to train on). Files beside the class folders in ROOT,
    other than images, are ignored. An empty class folder is a DataError, unless `classes=` is given: the names
    and label order to use (e.g. a training folder's view.classes, so that a validation folder lacking a class
    keeps the same labels); a folder not in it is then a DataError.

    Other options (size=, crop=, channels=, num_classes=, max_pixels=) are ImageFilesView's.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        classes=None,
        size=None,
        crop=None,
        channels: int | None = None,
        num_classes: int | None = None,
        max_pixels: int = IMAGE_MAX_PIXELS,
    ):
        root = os.fspath(path)
        if not os.path.isdir(root):
            raise DataError(f"{root}: no such folder (an image folder is ROOT/<class>/*.png)", root)
        names, given = _folder_classes(root, classes)
        paths, labels = [], []
        for k, name in enumerate(names):
            files = _class_files(root, name) if os.path.isdir(os.path.join(root, name)) else []
            if not files and not given:
                raise DataError(
                    f"{os.path.join(root, name)}: an empty class folder (no images): add its images, remove it, "
                    f"or pass classes= to keep it as a class without samples",
                    root,
                )
            paths += files
            labels += [k] * len(files)
        if not paths:
            raise DataError(
                f"{root}: empty dataset (no images in the class folders {', '.join(names[:10])})", root
            )
        super().__init__(
            paths,
            labels,
            classes=names,
            size=size,
            crop=crop,
            channels=channels,
            num_classes=num_classes,
            max_pixels=max_pixels,
            source=root,
        )


# -- list files -----------------------------------------------------------------------------------------------------
def _list_text(path: str, max_bytes: int) -> str:
    """The text of a list file (UTF-8, a byte order mark dropped), at most max_bytes."""
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            raise DataLimitError(
                f"{path}: a list file of {size_text(size)}, more than the {size_text(max_bytes)} allowed (pass "
                f"max_bytes= to allow more)",
                path,
                limit=max_bytes,
                needed=size,
            )
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})", path) from e
    try:
        return raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a text file (not UTF-8 at byte {e.start})", path) from e


def _column(names: list[str], wanted: tuple[str, ...], default: int) -> int:
    low = [n.strip().lower() for n in names]
    return next((k for k, n in enumerate(low) if n in wanted), default)


def _csv_rows(text: str, delimiter: str) -> list[tuple[int, list[str]]]:
    """(line number, stripped cells) of every non-blank row."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows, line = [], 1
    for cells in reader:
        if any(c.strip() for c in cells):
            rows.append((line, [c.strip() for c in cells]))
        line = reader.line_num + 1
    return rows


def _csv_entries(path: str, text: str, delimiter: str | None) -> list[tuple[str, str, object]]:
    """(where, image path, label text) of each row of a path,label CSV (a header row is recognised: its path cell
    is not an image name; it may name the columns: path/file/image..., label/class/target...)."""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if delimiter is None:
        delimiter = next((d for d in (",", "\t", ";") if d in first), ",")
    try:
        rows = _csv_rows(text, delimiter)
    except csv.Error as e:
        raise DataError(f"{path}: not a CSV list of path,label ({e})", path) from e
    if not rows:
        raise DataError(f"{path}: empty list (no rows)", path)
    header = None if is_image_name(rows[0][1][0]) else rows[0][1]
    width = 2 if header is None else len(header)
    path_col = 0 if header is None else _column(header, _PATH_COLUMNS, 0)
    label_col = 1 if header is None else _column(header, _LABEL_COLUMNS, 1 if path_col != 1 else 0)
    if width < 2 or path_col == label_col:
        raise DataError(
            f"{path}: a list of images needs two columns, path and label; the header has {header}", path
        )
    entries = []
    for line, cells in rows[header is not None :]:
        if len(cells) != width:
            form = "path,label (2 cells)" if header is None else f"{width} cells, as its header"
            raise DataError(
                f"{path}: line {line} has {len(cells)} cells; each row is {form} (quote a path that holds the "
                f"delimiter {delimiter!r})",
                path,
            )
        entries.append((f"line {line}", cells[path_col], cells[label_col]))
    return entries


def _json_entries(path: str, text: str) -> list[tuple[str, str, object]]:
    """(where, image path, label) of a JSON list: [{"path": ..., "label": ...}, ...] or {"path": label, ...}."""
    forms = '[{"path": "cat/1.png", "label": "cat"}, ...] or {"cat/1.png": "cat", ...}'
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise DataError(f"{path}: not valid JSON ({e}); a JSON image list is {forms}", path) from e
    if isinstance(data, dict):
        odd = next((k for k in data if not is_image_name(k)), None)
        if odd is not None:  # e.g. a COCO annotations file, which names images deeper down
            raise DataError(
                f"{path}: the key {odd[:80]!r} is not an image file name; a JSON image list is {forms}", path
            )
        return [(f"key {k!r}", k, v) for k, v in data.items()]
    if not isinstance(data, list):
        raise DataError(f"{path}: a JSON {type(data).__name__}; a JSON image list is {forms}", path)
    entries = []
    for n, item in enumerate(data, 1):
        keys = [k for k in item if isinstance(k, str)] if isinstance(item, dict) else []
        p = next((k for k in keys if k.lower() in _PATH_COLUMNS), None)
        y = next((k for k in keys if k.lower() in _LABEL_COLUMNS), None)
        if p is None or y is None:
            raise DataError(
                f"{path}: entry {n} is {json.dumps(item)[:80]}; a JSON image list is {forms}", path
            )
        entries.append((f"entry {n}", item[p], item[y]))
    return entries


_INTEGER = re.compile(r"[+-]?\d+")


def _classes_argument(classes) -> list[str]:
    if (
        isinstance(classes, str)
        or not all(isinstance(c, str) for c in classes)
        or len(set(classes)) != len(classes)
    ):
        raise ConfigError(f"classes must be a list of distinct class names, got {classes!r}")
    return list(classes)


def _label_ids(path: str, entries, classes) -> tuple[np.ndarray, list[str] | None]:
    """(int64 labels, class names or None) of list entries: when every label is a whole number (written as a
    number or as text), the numbers are the labels; otherwise every label is a class name, and the names sorted
    (or `classes`, when given) give the labels 0..K-1. A JSON list mixing numbers and names is refused."""
    texts = []
    for where, _, label in entries:
        if (
            isinstance(label, bool)
            or not isinstance(label, (str, numbers.Integral))
            or not str(label).strip()
        ):
            raise DataError(
                f"{path}: {where}: the label {repr(label)[:80]} is neither a class number nor a class name",
                path,
            )
        texts.append(str(label).strip())
    whole = [bool(_INTEGER.fullmatch(t)) for t in texts]
    if not all(whole) and any(not isinstance(label, str) for _, _, label in entries):
        k = whole.index(False)
        raise DataError(
            f"{path}: {entries[k][0]}: the class name {texts[k]!r} among class numbers: use numbers or names",
            path,
        )
    names = None if classes is None else _classes_argument(classes)
    if all(whole):
        ids = np.array([int(t) for t in texts], dtype=np.int64)
        top = len(names) if names is not None else None
        bad = np.flatnonzero((ids < 0) | (ids >= (top or 2**62)))
        if bad.size:
            k = int(bad[0])
            span = "0..K-1" if top is None else f"0..{top - 1}, the classes given"
            raise DataError(
                f"{path}: {entries[k][0]}: the label {ids[k]} is not a class number ({span})", path
            )
        return ids, names
    names = sorted(set(texts)) if names is None else names
    index = {n: k for k, n in enumerate(names)}
    for (where, _, _), t in zip(entries, texts):
        if t not in index:
            raise DataError(
                f"{path}: {where}: the class {t!r} is not one of classes= ({', '.join(names[:10])})", path
            )
    return np.array([index[t] for t in texts], dtype=np.int64), names


def _resolve(path: str, entries) -> list[str]:
    """The image files of list entries, relative to the list's folder (absolute paths stay), each checked to be
    an image name and to exist."""
    base = os.path.dirname(os.path.abspath(path))
    files = []
    for where, name, _ in entries:
        if not isinstance(name, str) or not is_image_name(name):
            raise DataError(
                f"{path}: {where}: {name!r} is not an image file name ({', '.join(IMAGE_EXTENSIONS)})", path
            )
        full = os.path.join(base, name.strip())
        if not os.path.isfile(full):
            raise DataError(
                f"{path}: {where}: no such image file {full} (paths are relative to the list's folder)", path
            )
        files.append(full)
    return files


class ImageListView(ImageFilesView):
    """The images a list file names, with their labels: a CSV of path,label rows (a header row allowed, which may
    name the columns: path/file/image..., label/class/target...; delimiter "," or tab or ";", found from the first
    row) or a JSON file, [{"path": ..., "label": ...}, ...] or {"path": label, ...}. Paths are relative to the
    list file's folder. A label is a class number, or a class name: when every label is a whole number the numbers
    are the labels, otherwise every label is a name, and the sorted names (or `classes=`) give the labels 0..K-1,
    as an ImageFolderView of the same classes would. The list's text may be at most max_bytes (CSV_MAX_BYTES).

    Other options (size=, crop=, channels=, num_classes=, max_pixels=) are ImageFilesView's.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        classes=None,
        size=None,
        crop=None,
        channels: int | None = None,
        num_classes: int | None = None,
        max_pixels: int = IMAGE_MAX_PIXELS,
        delimiter: str | None = None,
        max_bytes: int = CSV_MAX_BYTES,
    ):
        path = os.fspath(path)
        if delimiter is not None and not (
            isinstance(delimiter, str) and len(delimiter) == 1 and delimiter not in '"\r\n'
        ):
            raise ConfigError(
                f"delimiter must be one character (not a quote or a newline), got {delimiter!r}"
            )
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file", path)
        text = _list_text(path, limit_argument(max_bytes))
        if text.lstrip()[:1] in ("[", "{"):
            entries = _json_entries(path, text)
        else:
            entries = _csv_entries(path, text, delimiter)
        if not entries:
            raise DataError(f"{path}: empty list (no images)", path)
        labels, names = _label_ids(path, entries, classes)
        super().__init__(
            _resolve(path, entries),
            labels,
            classes=names,
            size=size,
            crop=crop,
            channels=channels,
            num_classes=num_classes,
            max_pixels=max_pixels,
            source=path,
        )


_JSON_IMAGE = re.compile(r'"[^"\n]*\.(?:png|jpe?g|bmp|gif|webp)"', re.IGNORECASE)


def image_list_kind(head: bytes, cut: bool) -> str | None:
    """'json' or 'csv' when `head`, a text file's first bytes, starts like a list of images: JSON naming image
    files, or rows whose first cells are image file names (after an optional header row). cut: head is only the
    start of the file (its last line may be incomplete)."""
    head = head.removeprefix(b"\xef\xbb\xbf")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if not cut or e.start < len(head) - 4:  # only a character cut at the end of the block is fine
            return None
        text = head[: e.start].decode("utf-8")
    if "\0" in text:
        return None
    if text.lstrip()[:1] in ("[", "{"):
        return "json" if _JSON_IMAGE.search(text) else None
    lines = [ln for ln in text.splitlines()[:8] if ln.strip()]
    if cut and len(lines) > 1:
        lines = lines[:-1]
    for d in (",", "\t", ";"):
        try:
            firsts = [next(csv.reader([ln], delimiter=d))[0] for ln in lines]
        except (csv.Error, StopIteration, IndexError):
            continue
        data = firsts if firsts and is_image_name(firsts[0]) else firsts[1:]
        if data and all(is_image_name(c) for c in data):
            return "csv"
    return None
