"""One image file -> its pixels, uint8 [H, W, C], decoded with Pillow (an optional dependency): read_image, and
the ceilings checked before an image is decoded: its pixels (IMAGE_MAX_PIXELS) and the bytes decoding it takes
(IMAGE_MAX_BYTES, estimated by decode_bytes from the header's mode and size)."""

from __future__ import annotations

import os
import struct

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .limits import limit_argument, size_text

# the largest image decoded: 64 Mi pixels (8192 x 8192; a 50-megapixel photo fits), 192 MiB as RGB; the size is
# read from the file's header and checked before its pixels are decoded (a decompression bomb is refused)
IMAGE_MAX_PIXELS = 1 << 26
# the memory decoding one image may take at its peak (Pillow's image, its copies on the way to uint8 [H, W, C] and
# the result: decode_bytes): an 8192 x 8192 RGB photo (960 MiB) fits; a file whose mode costs more bytes a pixel
# (RGBA, CMYK, WebP's decoder) meets it below the pixel ceiling
IMAGE_MAX_BYTES = 1 << 30
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


_BLOCK_PIXELS = 1 << 20  # pixels of a wide image narrowed at a time: int64 blocks of 8 MiB, whatever its size


def _narrowed(wide: np.ndarray) -> np.ndarray:
    """uint8 of 16-bit (or 32-bit) grayscale [H, W]: round(clip(v, 0, 65535) / 257) in int64, a block of rows at a
    time (the whole image in int64 would be 8 bytes a pixel, several times over)."""
    out = np.empty(wide.shape, dtype=np.uint8)
    rows = max(1, _BLOCK_PIXELS // max(1, wide.shape[1]))
    for r in range(0, wide.shape[0], rows):
        block = np.clip(wide[r : r + rows].astype(np.int64), 0, 65535)
        out[r : r + rows] = (block * 255 + 32767) // 65535
    return out


def _pixels(im, channels: int | None) -> np.ndarray:
    """uint8 [H, W, C] of a loaded Pillow image: C = `channels`, or the image's own (1 or 3) when None.

    16-bit grayscale becomes 8-bit by round(v / 257) (65535 -> 255, exact for 8-bit data stored as v * 257);
    alpha is dropped (as Pillow's convert("RGB") and torchvision do); palette, CMYK and YCbCr images become RGB by
    Pillow's conversion; color becomes grayscale by Pillow's convert("L") (ITU-R 601-2 luma); grayscale becomes
    color by repeating the one channel."""
    want = channels or _natural_channels(im)
    if im.mode in _WIDE_GRAY:
        a = _narrowed(np.asarray(im))
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


# bytes a pixel of a Pillow image in memory, by mode (every other mode: 4, as Pillow stores LA, RGB, I and F)
_STORED = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}
# bytes a pixel a format's decoder holds beside the image (libwebp decodes into a buffer of its own first); 1 for
# the others, a margin for their line buffers
_DECODER = {"WEBP": 11}


def decode_bytes(
    mode: str,
    width: int,
    height: int,
    channels: int | None = None,
    *,
    fmt: str = "",
    transparency: bool = False,
) -> int:
    """The bytes read_image holds at its peak to decode an image of Pillow `mode` (as the header says) and
    width x height pixels into uint8 [H, W, C], C = `channels` or the mode's own: the decoded image and the copy
    that applying its EXIF orientation makes (2 x the mode's bytes a pixel), the decoder's buffers, Pillow's
    conversions (to RGBA for a palette with `transparency`, to RGB, to L), the array numpy takes from the image
    (its bytes twice, as Pillow hands them over) and the result. A palette is counted as one of colors (whether
    its colors are grays is known only once decoded). Measured on PNG, JPEG, BMP, GIF and WebP files of every
    mode read here, which this bounds from above; known from the header, before anything is decoded."""
    stored = _STORED.get(mode, 4)
    gray = mode in _GRAY
    want = channels or (1 if gray else 3)
    per_pixel = 2 * stored + _DECODER.get(fmt, 1)
    extra = 0
    if mode in _WIDE_GRAY:  # the array of wide values, the uint8 result, and _narrowed's int64 blocks
        per_pixel += 2 * stored + 1
        extra = 4 * 8 * _BLOCK_PIXELS
    elif gray:  # converted to L (unless L already), then the array of 1 byte a pixel
        per_pixel += (mode != "L") + 2
    else:  # to RGBA first (a palette with transparency), to RGB, then its array (or to L, and that array)
        per_pixel += (
            4 * (mode == "P" and transparency) + 4 * (mode != "RGB") + (2 * 3 if want == 3 else 1 + 2)
        )
    if gray and want == 3:  # grayscale repeated to 3 channels
        per_pixel += 3
    return width * height * per_pixel + extra


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


def read_image(
    path, *, channels: int | None = None, max_pixels: int = IMAGE_MAX_PIXELS, max_bytes: int = IMAGE_MAX_BYTES
) -> np.ndarray:
    """The pixels of one PNG, JPEG, BMP, GIF (first frame) or WebP file: uint8 [H, W, C], channels last, with the
    file's EXIF orientation applied (a phone's portrait photo comes upright). C is `channels` (1: grayscale,
    3: RGB, converted as _pixels says), or the file's own: 1 for grayscale, 3 for everything else.

    The file's declared width x height must be at most `max_pixels`, and the bytes decoding it takes
    (decode_bytes: its mode's bytes a pixel and those of its conversion) at most `max_bytes`: a DataLimitError
    before decoding otherwise (a decompression bomb, or a 16-bit or RGBA image larger than its pixels say). A
    file that is missing, damaged, truncated or not one of these formats (by content, whatever its name) is a
    DataError naming it; without Pillow, a DataError saying how to install it."""
    path = os.fspath(path)
    max_pixels = limit_argument(max_pixels, "max_pixels")
    max_bytes = limit_argument(max_bytes, "max_bytes")
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
            _check_bytes(path, im, channels, max_bytes)
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


def _check_bytes(path: str, im, channels: int | None, max_bytes: int) -> None:
    """DataLimitError unless decoding the opened (not yet loaded) image takes at most max_bytes."""
    width, height = im.size
    need = decode_bytes(
        im.mode, width, height, channels, fmt=im.format or "", transparency="transparency" in im.info
    )
    if need > max_bytes:
        convert = (
            "" if im.mode in ("L", "RGB") else ", or save it as 8-bit RGB or grayscale, fewer bytes a pixel"
        )
        raise DataLimitError(
            f"{path}: decoding this {width} x {height} image of mode {im.mode} takes {size_text(need)}, more "
            f"than the {size_text(max_bytes)} allowed; refused before decoding it (scale it down{convert}; or "
            f"pass max_bytes=, an image view's max_image_bytes=, to allow more)",
            path,
            limit=max_bytes,
            needed=need,
        )
