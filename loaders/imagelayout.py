"""Which files are images and how a folder holds them: image extensions, the files a class folder may hold beside
its images, what an image file is by its first bytes (image_kind), a directory's layout of images two folder levels
deep (image_layout) and the messages that say how to lay images out."""

from __future__ import annotations

import os
import struct

from .errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
# files a class folder may hold beside its images, ignored: notes and metadata people keep with their pictures, and
# the files Windows drops into folders it shows (macOS's .DS_Store is hidden, as every name starting with a dot is)
SIDECAR_EXTENSIONS = (".txt", ".json")
SIDECAR_NAMES = ("thumbs.db", "desktop.ini")
_SPLIT_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing", "eval")


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


def _within(path: str, folder: str) -> bool:
    """Whether real path `path` is `folder` or inside it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def linked_folder_fault(folder: str, real: str, root: str, real_root: str, reached: list[str]) -> str | None:
    """Why an image folder's reading must not follow `folder`, a link (or inside one) that resolves to `real`
    (ROOT being `root`, `real_root` its real path, `reached` the real paths of the links followed before), or
    None when it leads elsewhere: a loop (it leads to ROOT, a folder holding ROOT or one holding the link), into
    ROOT (another folder's images, read again under this class), or to a folder another link reaches too."""
    fix = "remove the link, or replace it with a copy of the images it should add"
    if _within(real_root, real):
        return (
            f"{folder}: a link to {real}, which holds {root} itself: following it would read the image folder "
            f"again, without end; {fix}"
        )
    if _within(os.path.realpath(os.path.dirname(folder)), real):
        return f"{folder}: a link to {real}, which holds the link itself: following it never ends (a loop); {fix}"
    if _within(real, real_root):
        return (
            f"{folder}: a link to {real}, a folder inside {root}: its images are read already (or would be "
            f"read twice, under two classes); {fix}"
        )
    twice = next((r for r in reached if _within(real, r) or _within(r, real)), None)
    if twice is not None:
        return (
            f"{folder}: a link to {real}, which another link of {root} reaches too ({twice}): its images would be "
            f"read twice; {fix}"
        )
    return None


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
