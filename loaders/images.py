"""Image files as people keep them -> IDataViews of uint8 [H, W, C] samples, decoded lazily per batch with Pillow
(an optional dependency): ImageFilesView (paths and labels) and ImageFolderView (ROOT/<class>/*.png|jpg|...).
ImageListView (a CSV or JSON list of path,label) is in imagelists.py, read_image in imagedecode.py."""

from __future__ import annotations

import os

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .imagedecode import IMAGE_MAX_BYTES, IMAGE_MAX_PIXELS, read_image
from .imagelayout import (
    _SPLIT_NAMES,
    IMAGE_EXTENSIONS,
    SIDECAR_EXTENSIONS,
    _listing,
    _sidecar,
    image_layout,
    is_image_name,
    linked_folder_fault,
    loose_images_message,
)
from .imageops import center_crop, resize, size_pair
from .limits import limit_argument, size_text
from .values import count
from .views import IDataView, check_labels, class_count

# the most classes a view of image files numbers (labels 0..K-1, one name each in view.classes): far more than a
# classifier's head has (ImageNet-21k has 21,841), few enough that naming each costs tens of MiB at most
IMAGE_MAX_CLASSES = 1 << 20


def resize_bytes(height: int, width: int, channels: int, size: tuple[int, int]) -> int:
    """The bytes resizing a uint8 [height, width, channels] image to size = (H, W) holds at its peak
    (loaders.imageops.resize): the image, its float32 copy, the gathers and blends of the pass along H (4 arrays of
    [H, width]) and of the pass along W (4 of [H, W])."""
    h, w = size
    return channels * (height * width * (1 + 4) + 4 * 4 * h * width + 4 * 4 * h * w)


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
    label numbers as text); labels and num_classes number at most IMAGE_MAX_CLASSES classes. See read_image for
    the decoding rules and max_pixels; max_image_bytes bounds the bytes decoding one image takes (read_image's
    max_bytes), and resizing it (resize_bytes), each checked before it is done.
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
        max_image_bytes: int = IMAGE_MAX_BYTES,
        source: str = "<image files>",
    ):
        self.source = source
        self.max_pixels = limit_argument(max_pixels, "max_pixels")
        self.max_image_bytes = limit_argument(max_image_bytes, "max_image_bytes")
        self.resize_to, self.crop_to = _size_options(size, crop, self.max_image_bytes)
        if channels not in (None, 1, 3):
            raise ConfigError(
                f"channels must be 1 (grayscale), 3 (RGB) or None (the first image's), got {channels!r}"
            )
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise DataError(f"{source}: empty dataset (no image files)", source)
        self._labels, self.classes = _label_classes(source, labels, len(self.paths), classes, num_classes)
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
        a = read_image(
            path, channels=self._channels_option, max_pixels=self.max_pixels, max_bytes=self.max_image_bytes
        )
        if self._first is not None and a.shape[2] != self.channels:
            if self.channels == 1:
                raise DataError(
                    f"{path}: a color image, but {self._first[0]}, the first image, is grayscale (1 channel): pass "
                    f"channels=3 to read every image as RGB, or channels=1 to read every image as grayscale",
                    path,
                )
            a = np.repeat(a, 3, axis=2)  # grayscale among color images: exactly what channels=3 gives
        if self.resize_to is not None:
            need = resize_bytes(*a.shape, self.resize_to)
            if need > self.max_image_bytes:
                raise DataLimitError(
                    f"{path}: resizing its {a.shape[0]} x {a.shape[1]} pixels to size={self.resize_to} takes "
                    f"{size_text(need)}, more than the {size_text(self.max_image_bytes)} allowed; scale the image "
                    f"down first, or pass max_image_bytes= to allow more",
                    path,
                    limit=self.max_image_bytes,
                    needed=need,
                )
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


def _size_options(size, crop, max_bytes: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(size, crop) of an ImageFilesView, each (H, W) or None: a crop taken from a resized image fits in it, and
    the resized image (float32, up to 3 channels, and the blends that make it) takes at most max_bytes."""
    resize_to = None if size is None else size_pair(size, "size")
    crop_to = None if crop is None else size_pair(crop, "crop")
    if resize_to and crop_to and (crop_to[0] > resize_to[0] or crop_to[1] > resize_to[1]):
        raise ConfigError(
            f"crop={crop_to} is larger than size={resize_to}: a crop is taken from the resized image"
        )
    if resize_to and 3 * 4 * 4 * resize_to[0] * resize_to[1] > max_bytes:
        raise ConfigError(
            f"size={resize_to}: a resized image of {resize_to[0]} x {resize_to[1]} pixels takes "
            f"{size_text(3 * 4 * 4 * resize_to[0] * resize_to[1])} to make (float32), more than the "
            f"{size_text(max_bytes)} allowed for one image: pass a smaller size, or max_image_bytes= to allow more"
        )
    return resize_to, crop_to


def _label_classes(source: str, labels, n: int, classes, num_classes) -> tuple[np.ndarray, list[str]]:
    """(int64 labels, class names) of n image files: labels are integers >= 0, fewer than len(classes) when
    classes are given, and they and num_classes number at most IMAGE_MAX_CLASSES classes."""
    try:
        y = np.asarray(labels)
    except (ValueError, TypeError):  # ragged nesting
        y = np.asarray(None)
    if y.shape != (n,) or y.dtype.kind not in "iu" or (y < 0).any():
        raise ConfigError(
            f"{source}: {n} image paths need as many class labels, integers >= 0; got "
            f"{y.dtype} labels of shape {list(y.shape)}"
        )
    classes = None if classes is None else _classes_argument(classes)
    if classes is not None and num_classes is not None and class_count(num_classes) < len(classes):
        raise DataError(
            f"{source}: {len(classes)} classes ({', '.join(map(str, classes[:10]))}) but num_classes={num_classes}",
            source,
        )
    top = IMAGE_MAX_CLASSES if classes is None else len(classes)
    if int(y.max()) >= top:
        k = int(np.argmax(y))
        raise ConfigError(
            f"{source}: the label {int(y[k])} of image {k} is not a class number: labels are 0..{top - 1}"
            + (
                f" ({top} class names given)"
                if classes is not None
                else f", at most {IMAGE_MAX_CLASSES} classes"
            )
        )
    y = y.astype(np.int64)
    if num_classes is not None:
        count(class_count(num_classes), "num_classes", lo=1, hi=IMAGE_MAX_CLASSES)
    top = max(int(y.max()) + 1, 0 if num_classes is None else int(num_classes))
    return y, [str(k) for k in range(top)] if classes is None else classes


def _classes_argument(classes) -> list[str]:
    """A classes= argument: distinct class names, at most IMAGE_MAX_CLASSES (ConfigError otherwise)."""
    names = None if isinstance(classes, (str, bytes)) else _listed(classes)
    if names is None or not all(isinstance(c, str) for c in names) or len(set(names)) != len(names):
        raise ConfigError(f"classes must be a list of distinct class names, got {repr(classes)[:200]}")
    count(len(names), "the number of classes", hi=IMAGE_MAX_CLASSES)
    return names


def _listed(values) -> list | None:
    try:
        return list(values)
    except TypeError:  # not iterable
        return None


def _class_files(root: str, name: str, reached: list[str]) -> list[str]:
    """The image files of class folder ROOT/name, its subfolders included, in sorted order (a folder's files
    before its subfolders'); a file that is not an image, nor hidden, nor a sidecar, is a DataError naming it.

    A folder that is a symbolic link (or reached through one) is followed, as torchvision's ImageFolder follows
    links, unless it resolves into what the view reads already: ROOT itself or a folder holding it (a loop), a
    folder inside ROOT (whose images are another folder's), or a folder that another link, followed before,
    reaches too; that is a DataError naming the link and where it leads (linked_folder_fault). `reached` holds the
    real paths of the links followed so far (in the order of the classes, so the verdict is the same each time)."""
    found = []
    top = os.path.join(root, name)
    real_root = os.path.realpath(root)
    stack = [(top, os.path.join(real_root, name))]
    while stack:
        folder, expected = stack.pop()
        real = os.path.realpath(folder)
        if real != expected:  # a link, or inside one
            fault = linked_folder_fault(folder, real, root, real_root, reached)
            if fault:
                raise DataError(fault, folder)
            reached.append(real)
        subs, files = _listing(folder)
        for f in files:
            if _sidecar(f):
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
        stack += [(os.path.join(folder, s), os.path.join(real, s)) for s in reversed(subs)]
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
    odd = next((c for c in classes if c in ("", ".", "..") or "/" in c or os.sep in c), None)
    if odd is not None:
        raise ConfigError(
            f"classes= names the folders of {root}: {odd!r} is not a folder's name (one level, no separators)"
        )
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

    Other options (size=, crop=, channels=, num_classes=, max_pixels=, max_image_bytes=) are
    ImageFilesView's.
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
        max_image_bytes: int = IMAGE_MAX_BYTES,
    ):
        root = os.fspath(path)
        if not os.path.isdir(root):
            raise DataError(f"{root}: no such folder (an image folder is ROOT/<class>/*.png)", root)
        names, given = _folder_classes(root, classes)
        paths, labels, reached = [], [], []
        for k, name in enumerate(names):
            files = _class_files(root, name, reached) if os.path.isdir(os.path.join(root, name)) else []
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
            max_image_bytes=max_image_bytes,
            source=root,
        )
