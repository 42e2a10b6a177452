"""One image file -> its pixels, uint8 [H, W, C], decoded with Pillow (an optional dependency): read_image, and
the ceiling on an image's pixels checked before it is decoded (IMAGE_MAX_PIXELS)."""

from __future__ import annotations

import os
import struct

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .limits import limit_argument

# the largest image decoded: 64 Mi pixels (8192 x 8192; a 50-megapixel photo fits), 192 MiB as RGB; the size is
# read from the file's header and checked before its pixels are decoded (a decompression bomb is refused)
IMAGE_MAX_PIXELS = 1 << 26
# what Pillow may decode (its JPEG reader also opens cameras' multi-picture JPEGs); never its other plugins (EPS
# runs Ghostscript), whatever a file's name says
_PILLOW_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP")
_INSTALL = (
    "reading images needs Pillow, which is not installed here: pip install 'edgetrain[images]' (or convert the "
    "images to an .npz on a workstation: np.savez(path, x=images, y=labels))"
)


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
