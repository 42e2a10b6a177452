"""Images as people keep them: ROOT/<class>/ folders and CSV/JSON lists of real PNG, JPEG, BMP, GIF and WebP files
written with Pillow, decoded to the pixels Pillow itself gives; open_data recognises them and explains one image or
a folder without classes; resize matches onnxruntime's and onnx.reference's Resize; center_crop, hflip and rotate
match closed forms and Pillow; Augment is reproducible per (seed, epoch, sample) and a resumed DataLoader gives
bit-identical augmented batches."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from models import lenet
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from PIL import Image, ImageOps

import edgetrain as et
from loaders import (
    ArrayDataView,
    Augment,
    ConfigError,
    CsvDataView,
    DataError,
    DataLimitError,
    DataLoader,
    ImageFolderView,
    ImageListView,
    MnistDataView,
    open_data,
    read_image,
)
from loaders.imageops import center_crop, hflip, resize, rotate

ROOT = Path(__file__).resolve().parents[2]


# -- helpers ------------------------------------------------------------------------------------------------------
def pixels(h: int, w: int, c: int = 3, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)
    return a[:, :, 0] if c == 1 else a


def save(path: Path, a: np.ndarray, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path, **kw)
    return path


def pillow(path) -> np.ndarray:
    """What Pillow decodes, as [H, W, C]."""
    a = np.asarray(Image.open(path))
    return a[:, :, None] if a.ndim == 2 else a


def pets(tmp_path: Path) -> Path:
    """root/cat: two RGB PNGs; root/dog: a JPEG, an upper-case .PNG and a .webp; all 8 x 10; plus things to ignore."""
    root = tmp_path / "pets"
    save(root / "cat" / "a.png", pixels(8, 10, seed=1))
    save(root / "cat" / "b.png", pixels(8, 10, seed=2))
    save(root / "dog" / "c.jpg", pixels(8, 10, seed=3), quality=90)
    save(root / "dog" / "d.PNG", pixels(8, 10, seed=4))
    save(root / "dog" / "e.webp", pixels(8, 10, seed=5), lossless=True)
    (root / "cat" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "cat" / "notes.txt").write_text("taken at home")
    (root / "dog" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
    save(root / ".thumbnails" / "x.png", pixels(3, 3, seed=9))  # hidden folder: not a class
    (root / "README.md").write_text("my pets")  # beside the class folders: ignored
    return root


def png_header(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares width x height RGB pixels, with no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))
    return path


# -- image folders ------------------------------------------------------------------------------------------------
def test_a_folder_of_class_folders_gives_pillows_pixels_and_sorted_class_labels(tmp_path):
    root = pets(tmp_path)
    view = open_data(root)
    assert isinstance(view, ImageFolderView) and view.source == str(root)
    assert view.classes == ["cat", "dog"]
    files = ["cat/a.png", "cat/b.png", "dog/c.jpg", "dog/d.PNG", "dog/e.webp"]
    assert [Path(p).relative_to(root).as_posix() for p in view.paths] == files
    assert view.labels().tolist() == [0, 0, 1, 1, 1] and view.labels().dtype == np.int64
    for i, f in enumerate(files):
        x, y = view[i]
        assert x.dtype == np.uint8 and x.shape == (8, 10, 3)
        assert np.array_equal(x, pillow(root / f)), f
        assert int(y) == (0 if f.startswith("cat") else 1)
    assert np.array_equal(pillow(root / "cat/a.png"), pixels(8, 10, seed=1))  # PNG is lossless: a real check
    xb, yb = view.get_batch(np.array([4, 0, 2]))
    assert np.array_equal(xb, np.stack([view[4][0], view[0][0], view[2][0]])) and yb.tolist() == [1, 0, 1]
    assert view.finite_checked and len(view) == 5


def test_images_are_read_when_asked_for_not_kept(tmp_path):
    root = pets(tmp_path)
    view = ImageFolderView(root)
    save(
        root / "cat" / "b.png", pixels(8, 10, seed=42)
    )  # the user replaces a picture after the view was made
    assert np.array_equal(view[1][0], pixels(8, 10, seed=42))


def test_grayscale_color_and_the_channels_option(tmp_path):
    root = tmp_path / "digits"
    for k in range(3):
        save(root / str(k) / "a.png", pixels(6, 5, c=1, seed=k))
    view = ImageFolderView(root)
    assert view.sample_shape == (6, 5, 1) and view.channels == 1
    assert np.array_equal(view[2][0], pixels(6, 5, c=1, seed=2)[:, :, None])
    as_rgb = ImageFolderView(root, channels=3)[0][0]
    assert as_rgb.shape == (6, 5, 3) and all(
        np.array_equal(as_rgb[:, :, c], view[0][0][:, :, 0]) for c in range(3)
    )
    color = pets(tmp_path)
    gray = ImageFolderView(color, channels=1)
    expect = np.asarray(Image.open(color / "cat/a.png").convert("L"))[:, :, None]
    assert gray[0][0].shape == (8, 10, 1) and np.array_equal(gray[0][0], expect)
    with pytest.raises(ConfigError, match="channels must be 1"):
        ImageFolderView(root, channels=4)


def test_a_gray_image_among_color_ones_is_repeated_a_color_one_among_gray_is_refused(tmp_path):
    root = tmp_path / "mixed"
    save(root / "a" / "1.png", pixels(4, 4, seed=0))
    save(root / "a" / "2.png", pixels(4, 4, c=1, seed=1))
    view = ImageFolderView(root)
    assert np.array_equal(view[1][0], np.repeat(pixels(4, 4, c=1, seed=1)[:, :, None], 3, axis=2))
    other = tmp_path / "other"
    save(other / "a" / "1.png", pixels(4, 4, c=1, seed=0))
    save(other / "a" / "2.png", pixels(4, 4, seed=1))
    view = ImageFolderView(other)
    with pytest.raises(
        DataError, match=r"2\.png: a color image, but .*1\.png, the first image, is grayscale.*channels=3"
    ):
        view[1]
    assert ImageFolderView(other, channels=3)[1][0].shape == (4, 4, 3)


def test_modes_alpha_palette_16_bit_and_exif_orientation(tmp_path):
    root = tmp_path / "modes"
    rgba = np.random.default_rng(0).integers(0, 256, (5, 6, 4), dtype=np.uint8)
    save(root / "k" / "1_rgba.png", rgba)
    Image.fromarray(pixels(5, 6, seed=1)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(
        root / "k" / "2_palette.png"
    )
    wide = np.random.default_rng(2).integers(0, 65536, (5, 6), dtype=np.uint16)
    Image.fromarray(wide).save(root / "k" / "3_sixteen.png")  # mode I;16
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to view": the pixels are stored 6 x 5
    save(root / "k" / "4_portrait.jpg", pixels(6, 5, seed=3), exif=exif, quality=95)
    view = ImageFolderView(root, channels=3)
    assert np.array_equal(view[0][0], rgba[:, :, :3])  # alpha dropped, as convert("RGB") does
    assert np.array_equal(view[1][0], np.asarray(Image.open(root / "k/2_palette.png").convert("RGB")))
    eight = np.floor(wide.astype(np.float64) / 257 + 0.5).astype(np.uint8)  # round(v / 257)
    assert np.array_equal(view[2][0], np.repeat(eight[:, :, None], 3, axis=2))
    upright = np.asarray(ImageOps.exif_transpose(Image.open(root / "k/4_portrait.jpg")))
    assert upright.shape == (5, 6, 3) and np.array_equal(view[3][0], upright)
    assert read_image(root / "k/3_sixteen.png").shape == (5, 6, 1)
    save(tmp_path / "c.gif", pixels(5, 6, seed=4))  # a palette of the image's colors
    assert np.array_equal(
        read_image(tmp_path / "c.gif"), np.asarray(Image.open(tmp_path / "c.gif").convert("RGB"))
    )
    save(tmp_path / "g.gif", pixels(5, 6, c=1, seed=5))  # a palette of grays: one channel
    gray = read_image(tmp_path / "g.gif")
    assert gray.shape == (5, 6, 1) and np.array_equal(gray[:, :, 0], pixels(5, 6, c=1, seed=5))
    save(tmp_path / "b.bmp", pixels(5, 6, seed=6))
    assert np.array_equal(read_image(tmp_path / "b.bmp"), pixels(5, 6, seed=6))


def test_images_of_another_size_are_refused_naming_both_unless_size_or_crop(tmp_path):
    root = tmp_path / "sizes"
    save(root / "a" / "1.png", pixels(8, 10, seed=0))
    save(root / "b" / "2.jpg", pixels(13, 7, seed=1))
    view = ImageFolderView(root)
    with pytest.raises(
        DataError, match=r"2\.jpg: 13 x 7 pixels .*1\.png, the first image, is 8 x 10.*size="
    ) as e:
        view.get_batch(np.array([0, 1]))
    assert e.value.path.endswith("2.jpg")
    sized = open_data(root, size=(6, 9))
    x, _ = sized.get_batch(np.array([0, 1]))
    assert x.dtype == np.float32 and x.shape == (2, 6, 9, 3)
    for k, f in enumerate(["a/1.png", "b/2.jpg"]):
        assert np.array_equal(x[k], resize(pillow(root / f).astype(np.float32), (6, 9)))
    assert 0 <= x.min() and x.max() <= 255
    cropped = ImageFolderView(root, size=(6, 9), crop=(4, 5))[1][0]
    assert np.array_equal(cropped, resize(pillow(root / "b/2.jpg").astype(np.float32), (6, 9))[1:5, 2:7])
    only_crop = ImageFolderView(root, crop=(6, 5))  # no resize: each image's own center, as uint8
    big = pillow(root / "b/2.jpg")
    assert only_crop[1][0].dtype == np.uint8 and np.array_equal(only_crop[1][0], big[4:10, 1:6])
    with pytest.raises(DataError, match=r"1\.png: 8 x 10 pixels .*smaller than crop=\(9, 5\)"):
        ImageFolderView(root, crop=(9, 5))
    with pytest.raises(ConfigError, match="larger than size"):
        ImageFolderView(root, size=(6, 9), crop=(7, 9))
    with pytest.raises(ConfigError, match=r"size must be a pair \(H, W\)"):
        ImageFolderView(root, size=6)


def test_a_stray_file_is_named_sidecars_and_hidden_files_are_not(tmp_path):
    root = pets(tmp_path)
    (root / "dog" / "report.docx").write_bytes(b"PK\3\4")
    with pytest.raises(DataError, match=r"report\.docx: not an image .* in the class folder 'dog'") as e:
        open_data(root)
    assert e.value.path.endswith("report.docx")


def test_an_empty_class_folder_is_refused_unless_classes_are_given(tmp_path):
    root = pets(tmp_path)
    (root / "bird").mkdir()
    with pytest.raises(DataError, match=r"bird: an empty class folder .*classes="):
        ImageFolderView(root)
    view = ImageFolderView(root, classes=["dog", "bird", "cat"])
    assert view.classes == ["dog", "bird", "cat"] and view.labels().tolist() == [0, 0, 0, 2, 2]
    assert [Path(p).parent.name for p in view.paths] == ["dog"] * 3 + ["cat"] * 2
    with pytest.raises(DataError, match="'cat' is not one of the classes given"):
        ImageFolderView(root, classes=["dog", "bird"])
    with pytest.raises(DataError, match=r"2 classes \(cat, dog\) but num_classes=1"):
        ImageFolderView(pets(tmp_path / "again"), num_classes=1)


def test_a_truncated_or_fake_image_is_a_data_error_naming_it(tmp_path):
    root = pets(tmp_path)
    for name in ("dog/c.jpg", "dog/d.PNG"):
        data = (root / name).read_bytes()
        (root / name).write_bytes(data[: len(data) // 2])
    (root / "cat" / "b.png").write_text("not a picture")
    view = ImageFolderView(root)
    for i, name in [(1, "b.png"), (2, "c.jpg"), (3, "d.PNG")]:
        with pytest.raises(DataError, match=rf"{name}: (a damaged or truncated|not an image file)") as e:
            view[i]
        assert e.value.path.endswith(name)
    (root / "cat" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # the first image too: refused at once
    with pytest.raises(DataError, match=r"a\.png"):
        ImageFolderView(root)


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path):
    bomb = png_header(tmp_path / "bomb.png", 9000, 9000)  # 81 M pixels declared, no data
    with pytest.raises(
        DataLimitError, match=r"bomb\.png: an image of 9000 x 9000 pixels, more than the 67108864"
    ):
        read_image(bomb)
    huge = png_header(tmp_path / "huge.png", 30000, 30000)  # beyond Pillow's own bound too
    with pytest.raises(DataLimitError, match=r"huge\.png"):
        read_image(huge)
    small = save(tmp_path / "s.png", pixels(8, 10))
    with pytest.raises(DataLimitError, match="more than the 79 allowed"):
        read_image(small, max_pixels=79)
    assert read_image(small, max_pixels=80).shape == (8, 10, 3)


# -- lists ----------------------------------------------------------------------------------------------------------
def test_a_csv_list_of_class_names_gives_the_folder_labels(tmp_path):
    root = pets(tmp_path)
    rows = ["file,category", "dog/c.jpg,dog", '"cat/a.png",cat', "", "dog/e.webp,dog", "cat/b.png,cat"]
    (root / "list.csv").write_text("\n".join(rows) + "\n")
    view = open_data(root / "list.csv")
    assert isinstance(view, ImageListView) and view.classes == ["cat", "dog"]
    assert view.labels().tolist() == [1, 0, 1, 0]
    assert np.array_equal(view[1][0], pillow(root / "cat/a.png"))
    folder = ImageFolderView(root)
    by_path = dict(zip(folder.paths, folder.labels().tolist()))
    assert [by_path[p] for p in view.paths] == view.labels().tolist()


def test_csv_lists_without_header_with_numbers_tabs_or_in_another_folder(tmp_path):
    root = pets(tmp_path)
    (tmp_path / "n.csv").write_text("pets/cat/a.png,3\npets/dog/c.jpg,0\n")
    view = open_data(tmp_path / "n.csv", num_classes=4)
    assert view.labels().tolist() == [3, 0] and view.classes == ["0", "1", "2", "3"]
    (root / "t.tsv").write_text("path\tlabel\ncat/a.png\t1\ndog/d.PNG\t0\n")
    assert open_data(root / "t.tsv").labels().tolist() == [1, 0]
    (root / "bad.csv").write_text("cat/a.png,1\ncat/missing.png,0\n")
    with pytest.raises(DataError, match=r"bad\.csv: line 2: no such image file .*missing\.png"):
        open_data(root / "bad.csv")
    (root / "wide.csv").write_text("cat/a.png,1,x\n")
    with pytest.raises(DataError, match=r"wide\.csv: line 1 has 3 cells"):
        ImageListView(root / "wide.csv")
    (root / "neg.csv").write_text("cat/a.png,-1\n")
    with pytest.raises(DataError, match="the label -1 is not a class number"):
        ImageListView(root / "neg.csv")


def test_json_lists_in_both_forms(tmp_path):
    root = pets(tmp_path)
    records = [{"path": "dog/d.PNG", "label": "dog"}, {"path": "cat/b.png", "label": "cat"}]
    (root / "l.json").write_text(json.dumps(records, indent=2))
    view = open_data(root / "l.json")
    assert (
        isinstance(view, ImageListView)
        and view.labels().tolist() == [1, 0]
        and view.classes == ["cat", "dog"]
    )
    assert np.array_equal(view[0][0], pillow(root / "dog/d.PNG"))
    (root / "m.json").write_text(json.dumps({"cat/a.png": 1, "dog/c.jpg": 0}))
    assert open_data(root / "m.json").labels().tolist() == [1, 0]
    (root / "mixed.json").write_text(json.dumps({"cat/a.png": 1, "dog/c.jpg": "dog"}))
    with pytest.raises(DataError, match="class name 'dog' among class numbers"):
        open_data(root / "mixed.json")
    (root / "coco.json").write_text(json.dumps({"images": [{"file_name": "cat/a.png"}], "annotations": []}))
    with pytest.raises(DataError, match=r"coco\.json: the key 'images' is not an image file name"):
        open_data(root / "coco.json")
    (root / "odd.json").write_text(json.dumps([{"file": "cat/a.png"}]))
    with pytest.raises(DataError, match=r"odd\.json: entry 1 is .* a JSON image list is"):
        ImageListView(root / "odd.json")


def test_a_text_csv_that_lists_no_images_reads_as_before(tmp_path):
    text = tmp_path / "people.csv"
    text.write_text("name,age,label\nann,31,0\nbob,42,1\n")
    with pytest.raises(DataError) as by_open:
        open_data(text)
    with pytest.raises(DataError) as by_csv:
        CsvDataView(text)
    assert str(by_open.value) == str(by_csv.value) and "name" in str(by_open.value)
    numeric = tmp_path / "n.csv"
    numeric.write_text("1,2,0\n3,4,1\n")
    assert isinstance(open_data(numeric), CsvDataView)


# -- what is not a dataset ------------------------------------------------------------------------------------------
def test_one_image_or_a_folder_without_classes_says_how_to_lay_images_out(tmp_path):
    root = pets(tmp_path)
    with pytest.raises(
        DataError, match=r"a\.png: a PNG image: one image is not a dataset; put images in ROOT/<class>/"
    ):
        open_data(root / "cat" / "a.png")
    with pytest.raises(DataError, match=r"c\.jpg: a JPEG image: one image is not a dataset"):
        open_data(root / "dog" / "c.jpg")
    save(tmp_path / "x.bmp", pixels(3, 3))
    with pytest.raises(DataError, match="a BMP image: one image"):
        open_data(tmp_path / "x.bmp")
    with pytest.raises(
        DataError, match=r"cat: a folder of 2 images \(a\.png, b\.png\) without class folders.*path,label"
    ):
        open_data(root / "cat")
    with pytest.raises(DataError, match="not an MNIST directory; it holds folders of images \\(cat, dog\\)"):
        MnistDataView.from_dir(root)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no MNIST train images file"):
        open_data(empty)


def test_split_folders_are_named_and_chosen_by_split(tmp_path):
    data = tmp_path / "data"
    for split, seed in (("train", 0), ("val", 1)):
        for c in ("cat", "dog"):
            save(data / split / c / "1.png", pixels(4, 4, seed=seed))
    with pytest.raises(DataError, match=r"holds the splits train, val .*split="):
        open_data(data)
    val = open_data(data, split="val")
    assert isinstance(val, ImageFolderView) and val.classes == ["cat", "dog"]
    assert np.array_equal(val[0][0], pixels(4, 4, seed=1))
    with pytest.raises(DataError, match="are splits .* not classes"):
        ImageFolderView(data)


def test_without_pillow_the_error_says_how_to_install_it(tmp_path):
    root = pets(tmp_path)
    code = (
        "import sys; sys.modules['PIL'] = None\n"
        "import loaders\n"
        "try:\n"
        f"    loaders.open_data({str(root)!r})\n"
        "except loaders.DataError as e:\n"
        "    print('DataError:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "DataError:" in done.stdout and "pip install 'edgetrain[images]'" in done.stdout, done.stdout
    assert str(root / "cat" / "a.png") in done.stdout


# -- imageops -------------------------------------------------------------------------------------------------------
def _resize_model(shape, size):
    n, _, _, c = shape
    node = helper.make_node(
        "Resize", ["x", "", "", "sizes"], ["y"], mode="linear", coordinate_transformation_mode="half_pixel"
    )
    graph = helper.make_graph(
        [node],
        "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("sizes", TensorProto.INT64, [4], [n, size[0], size[1], c])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


RESIZES = [(7, 9, 13, 5), (32, 32, 17, 45), (31, 47, 100, 3), (224, 300, 97, 113), (1, 8, 4, 3), (5, 5, 5, 5)]


@pytest.mark.parametrize("h,w,out_h,out_w", RESIZES)
def test_resize_is_onnxruntimes_resize(h, w, out_h, out_w, report):
    ort = pytest.importorskip(
        "onnxruntime"
    )  # in the dev extra; skipped where only the device side is installed
    x = np.random.default_rng(h * w).uniform(0, 255, (2, h, w, 3)).astype(np.float32)
    model = _resize_model(x.shape, (out_h, out_w))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    got = resize(x, (out_h, out_w))
    assert got.shape == expected.shape == (2, out_h, out_w, 3) and got.dtype == np.float32
    diff = float(np.abs(got - expected).max())
    report(
        "loaders.imageops.resize vs onnxruntime Resize",
        f"{h}x{w} -> {out_h}x{out_w}: max abs diff {diff:.2e}",
    )
    assert diff <= 1e-4
    nchw = resize(x.transpose(0, 3, 1, 2), (out_h, out_w), layout="nchw")
    assert np.array_equal(nchw, got.transpose(0, 3, 1, 2))
    assert np.array_equal(resize(x[0], (out_h, out_w)), got[0])  # one image [H, W, C]


@pytest.mark.parametrize("h,w,out_h,out_w", [(7, 9, 14, 18), (12, 20, 3, 5), (8, 6, 16, 3), (9, 11, 13, 5)])
def test_resize_is_the_onnx_reference_resize(h, w, out_h, out_w):
    """onnx.reference computes the scale out/in in float64 where onnxruntime (and we) use float32, so they agree
    to 1e-4 when that scale is exact in float32 (powers of two here) and where the coordinates stay small."""
    x = np.random.default_rng(h + w).uniform(0, 255, (1, h, w, 2)).astype(np.float32)
    expected = ReferenceEvaluator(_resize_model(x.shape, (out_h, out_w))).run(None, {"x": x})[0]
    assert np.abs(resize(x, (out_h, out_w)) - expected).max() <= 1e-4


def test_resize_of_uint8_is_float32_and_a_constant_stays_constant():
    x = np.full((4, 6, 1), 200, np.uint8)
    y = resize(x, (9, 3))
    assert y.dtype == np.float32 and np.array_equal(y, np.full((9, 3, 1), 200, np.float32))
    with pytest.raises(ConfigError, match="an image is"):
        resize(np.zeros((4, 4)), (2, 2))


def test_center_crop_and_hflip():
    x = np.arange(2 * 7 * 8 * 3).reshape(2, 7, 8, 3)
    # torchvision's CenterCrop: top = round((7 - 4) / 2) = 2 (half to even), left = round((8 - 3) / 2) = 2
    assert np.array_equal(center_crop(x, (4, 3)), x[:, 2:6, 2:5, :])
    assert np.array_equal(center_crop(x, (7, 8)), x)
    assert np.array_equal(
        center_crop(x.transpose(0, 3, 1, 2), (4, 3), layout="nchw"), x[:, 2:6, 2:5, :].transpose(0, 3, 1, 2)
    )
    assert np.array_equal(hflip(x), x[:, :, ::-1, :])
    assert np.array_equal(
        hflip(x.transpose(0, 3, 1, 2), layout="nchw"), x[:, :, ::-1, :].transpose(0, 3, 1, 2)
    )
    with pytest.raises(ConfigError, match="does not fit"):
        center_crop(x, (8, 3))


def test_rotate_turns_counterclockwise_as_pillow_does():
    square = np.random.default_rng(0).uniform(0, 255, (9, 9, 2)).astype(np.float32)
    assert np.array_equal(rotate(square, 0), square)
    assert np.array_equal(rotate(square, 90), np.rot90(square, 1, axes=(0, 1)))  # counterclockwise on screen
    assert np.array_equal(rotate(square, -90), np.rot90(square, -1, axes=(0, 1)))
    wide = np.random.default_rng(1).uniform(0, 255, (5, 8, 1)).astype(np.float32)
    assert np.array_equal(rotate(wide, 180), wide[::-1, ::-1])
    dot = np.zeros((9, 9, 1), np.float32)
    dot[0, 4] = 1  # top middle: a quarter turn counterclockwise moves it to the left middle
    assert rotate(dot, 90)[4, 0, 0] == 1 and rotate(dot, 90).sum() == 1
    cross = np.zeros((9, 9, 1), np.float32)
    cross[4, 1:8] = cross[1:8, 4] = 1  # 90-degree symmetric about the center: a wrong center moves it
    assert np.array_equal(rotate(cross, 90), cross) and np.array_equal(rotate(cross, -270), cross)
    for degrees in (7.3, -12.0, 33.0):
        image = Image.fromarray(wide[:, :, 0], mode="F").rotate(degrees, resample=Image.BILINEAR)
        assert np.abs(rotate(wide, degrees)[:, :, 0] - np.asarray(image)).max() <= 1e-3, degrees
    edge = rotate(wide, 30, fill="edge")
    assert edge.min() >= wide.min() and (rotate(wide, 30) == 0).any() and not (edge == 0).any()


# -- augmentation ---------------------------------------------------------------------------------------------------
def batch(n: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 10, 3), dtype=np.uint8)


def test_augment_is_a_function_of_seed_epoch_and_sample():
    aug = Augment(crop=2, flip=True, rotate=10, seed=3)
    x, y = batch(), np.arange(6)
    a, ya = aug(x, y, epoch=0, indices=np.arange(10, 16))
    b, _ = aug(x, y, epoch=0, indices=np.arange(10, 16))
    assert a.dtype == np.float32 and np.array_equal(a, b) and ya is y
    alone, _ = aug(x[3:4], y[3:4], epoch=0, indices=[13])  # the same sample in another batch
    assert np.array_equal(alone[0], a[3])
    later, _ = aug(x, y, epoch=1, indices=np.arange(10, 16))
    assert all(not np.array_equal(later[k], a[k]) for k in range(6))
    other_seed, _ = Augment(crop=2, flip=True, rotate=10, seed=4)(x, y, epoch=0, indices=np.arange(10, 16))
    assert not np.array_equal(other_seed, a)
    loaders_seed, _ = Augment(crop=2, flip=True, rotate=10)(x, y, epoch=0, indices=np.arange(10, 16), seed=3)
    assert np.array_equal(loaders_seed, a)


def test_augment_steps_against_their_closed_forms():
    x, y = batch(64), np.arange(64)
    flip = Augment(flip=True, seed=0)
    out, _ = flip(x, y, epoch=2, indices=np.arange(64))
    flipped = [flip.draws(0, 2, i)[2] for i in range(64)]
    assert 16 < sum(flipped) < 48
    for k in range(64):
        assert np.array_equal(out[k], x[k, :, ::-1, :] if flipped[k] else x[k])
    assert out.dtype == np.uint8
    crop = Augment(crop=3, seed=0)
    out, _ = crop(x, y, epoch=0, indices=np.arange(64))
    padded = np.pad(x, [(0, 0), (3, 3), (3, 3), (0, 0)])
    offsets = [crop.draws(0, 0, i)[:2] for i in range(64)]
    assert len(set(offsets)) > 10 and all(0 <= t <= 6 and 0 <= left <= 6 for t, left in offsets)
    for k, (t, left) in enumerate(offsets):
        assert np.array_equal(out[k], padded[k, t : t + 8, left : left + 10])
    assert np.array_equal(
        Augment(seed=0)(x, y, epoch=0, indices=np.arange(64))[0], x
    )  # nothing: the identity
    spin = Augment(rotate=15, seed=0)
    out, _ = spin(x[:4], y[:4], epoch=0, indices=np.arange(4))
    for k in range(4):
        angle = spin.draws(0, 0, k)[3]
        assert -15 <= angle <= 15 and np.array_equal(out[k], rotate(x[k], angle))


def test_augment_layouts_and_what_is_not_an_image():
    x, y = batch(), np.arange(6)
    aug = Augment(crop=2, flip=True, rotate=10, seed=1)
    nhwc, _ = aug(x, y, epoch=0, indices=np.arange(6))
    nchw, _ = Augment(crop=2, flip=True, rotate=10, seed=1, layout="nchw")(
        x.transpose(0, 3, 1, 2), y, epoch=0, indices=np.arange(6)
    )
    assert np.array_equal(nchw, nhwc.transpose(0, 3, 1, 2))
    with pytest.raises(ConfigError, match=r"works on batches of images.*samples of shape \[784\]"):
        aug(np.zeros((2, 784), np.float32), y[:2], epoch=0, indices=[0, 1])
    with pytest.raises(ConfigError, match="no seed"):
        Augment(flip=True)(x, y, epoch=0, indices=np.arange(6))


def test_augment_parse():
    aug = Augment.parse("crop:4, flip ,rotate:12.5", seed=2)
    assert (aug.crop, aug.flip, aug.rotate, aug.seed) == (4, True, 12.5, 2)
    assert aug.text == "crop:4,flip,rotate:12.5" and Augment.parse(aug.text).text == aug.text
    for bad in ("", "crop", "crop:x", "flip:1", "zoom:2", "flip,flip", "crop:-1", "rotate:200"):
        with pytest.raises(
            ConfigError, match="crop:N" if bad not in ("crop:-1", "rotate:200") else "from 0 to"
        ):
            Augment.parse(bad)


def test_a_resumed_loader_gives_the_same_augmented_batches(tmp_path):
    root = tmp_path / "many"
    for k in range(10):
        save(root / f"c{k % 3}" / f"{k}.png", pixels(8, 10, seed=k))
    view = ImageFolderView(root)

    def loader():
        return DataLoader(view, 4, shuffle=True, seed=11, augment=Augment.parse("crop:2,flip,rotate:8"))

    whole = loader()
    straight = [whole.next() for _ in range(8)]  # two epochs and more: 3 batches per epoch
    first = loader()
    for _ in range(4):
        first.next()
    state = json.loads(json.dumps(first.state()))
    resumed = loader()
    resumed.restore(state)
    for (xa, ya), (xb, yb) in zip(straight[4:], [resumed.next() for _ in range(4)]):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert straight[0][0].dtype == np.float32 and straight[0][0].shape == (4, 8, 10, 3)
    plain = DataLoader(view, 4, shuffle=True, seed=11)
    assert not np.array_equal(plain.next()[0].astype(np.float32), straight[0][0])
    assert "augment" not in whole.state()


def test_the_trainer_turns_the_feature_cache_off_under_augment(tmp_path):
    art = et.convert(
        lenet(batch=2), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.01), trainable=["fc3.*"]
    )
    art.save(str(tmp_path / "m.etrain"))
    sess = et.TrainingSession(str(tmp_path / "m.etrain"))
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    loader = DataLoader(ArrayDataView(x, np.arange(4)), 2, seed=0, augment=Augment(flip=True, layout="nchw"))
    trainer = et.Trainer(sess, loader, epochs=1)
    assert not trainer.feature_cache["enabled"] and "augment" in trainer.feature_cache["reason"]
