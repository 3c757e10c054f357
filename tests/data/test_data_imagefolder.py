"""The image-folder loader (a user's own images) on fixture trees: classes, the user's own test/ split,
grey and colour, 16-bit, sizes, and every bad input as one error naming the file or folder."""

import numpy as np
import pytest
from PIL import Image

from fixtures_data import write_imagefolder
from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data import load_dataset


def load(path, **kw):
    return load_dataset(DataConfig(name="imagefolder", path=str(path), **kw))


def raw(ds, split, channel=0):
    """A split's images as stored before standardisation, per image the mean of ``channel`` x 255."""
    mean, std = (np.float32(ds.normalization[k][channel]) for k in ("mean", "std"))
    return [round(float((im[channel] * std + mean).mean()) * 255) for im in split.x]


def test_own_test_folder_is_the_held_out_split_and_validation_comes_from_train(tmp_path):
    levels = write_imagefolder(
        tmp_path / "Chest X", {"train": {"normal": 20, "pneumonia": 11}, "test": {"normal": 6, "pneumonia": 4}}
    )
    ds = load(tmp_path / "Chest X")
    assert ds.name == "Chest X" and ds.class_names == ("normal", "pneumonia") and ds.input_shape == (1, 10, 12)
    # the test split is exactly test/'s ten images, labelled by their folder
    assert sorted(zip(raw(ds, ds.test), ds.test.y.tolist())) == sorted(
        [(g, 0) for g in levels["test", "normal"]] + [(g, 1) for g in levels["test", "pneumonia"]]
    )
    assert ds.eval_split == "the folder's own test/ (10 images)"
    # validation: round(0.1 * 20) = 2 and round(0.1 * 11) = 1 (1.1) of train/, the rest trains
    assert np.bincount(ds.val.y).tolist() == [2, 1] and np.bincount(ds.train.y).tolist() == [18, 10]
    train_levels = {g: c for c, name in enumerate(ds.class_names) for g in levels["train", name]}
    for split in (ds.train, ds.val):
        assert [train_levels[g] for g in raw(ds, split)] == split.y.tolist()
    assert sorted(raw(ds, ds.train) + raw(ds, ds.val)) == sorted(train_levels)
    assert "(3 images)" in ds.val_split and "split_seed=0" in ds.val_split
    trained = np.array(raw(ds, ds.train)) / 255.0  # standardised with train's statistics only
    assert ds.normalization["mean"] == pytest.approx([trained.mean()], abs=1e-5)
    assert ds.preprocessing == "grey, 1 channel; read at their own size, not resized"
    assert ds.warnings == ()


def test_a_val_folder_is_the_validation_split_and_the_split_seed_moves_only_a_carved_one(tmp_path):
    levels = write_imagefolder(
        tmp_path / "d",
        {"train": {"a": 5, "b": 5}, "test": {"a": 2, "b": 2}, "val": {"a": 3, "b": 1}},
    )
    ds = load(tmp_path / "d", split_seed=7, display_name="My scans")
    assert ds.name == "My scans" and ds.val_split == "the folder's own val/ (4 images)"
    assert sorted(raw(ds, ds.val)) == sorted(levels["val", "a"] + levels["val", "b"])
    assert len(ds.train.y) == 10  # nothing of train/ is carved away


def test_numeric_class_names_sort_by_number_and_data_classes_sets_the_order(tmp_path):
    write_imagefolder(tmp_path / "d", {"": {"10": 5, "2": 5, "1": 5}})
    assert load(tmp_path / "d", test_fraction=0.2, val_fraction=0.2).class_names == ("1", "2", "10")
    write_imagefolder(tmp_path / "e", {"": {"b": 5, "a": 5, "B": 5}})
    assert load(tmp_path / "e", test_fraction=0.2, val_fraction=0.2).class_names == ("B", "a", "b")
    chosen = load(tmp_path / "e", classes=["b", "a"], test_fraction=0.2, val_fraction=0.2)
    assert chosen.class_names == ("b", "a") and len(chosen.train.y) + len(chosen.val.y) + len(chosen.test.y) == 10


def test_one_folder_is_split_stratified_like_the_other_folder_formats(tmp_path):
    levels = write_imagefolder(tmp_path / "d", {"": {"x": 11, "y": 8}})
    ds = load(tmp_path / "d")
    # x 11: 2 test (2.2), 1 val (0.9), 8 train; y 8: 2 test (1.6), 1 val (0.6), 5 train
    assert np.bincount(ds.test.y).tolist() == [2, 2] and np.bincount(ds.val.y).tolist() == [1, 1]
    assert sorted(raw(ds, ds.train) + raw(ds, ds.val) + raw(ds, ds.test)) == sorted(sum(levels.values(), []))
    assert "stratified 0.2 of each class held out" in ds.eval_split


def test_sub_folders_and_upper_case_extensions_count_hidden_and_other_files_do_not(tmp_path):
    write_imagefolder(tmp_path / "d", {"": {"a": 4, "b": 4}})
    (tmp_path / "d" / "a" / "deeper").mkdir()
    Image.new("L", (12, 10), 200).save(tmp_path / "d" / "a" / "deeper" / "X.PNG")
    Image.new("L", (12, 10), 201).convert("RGB").save(tmp_path / "d" / "b" / "photo.JPG")
    Image.new("L", (12, 10), 202).save(tmp_path / "d" / "b" / ".hidden.png")
    (tmp_path / "d" / "b" / "notes.txt").write_text("not an image")
    (tmp_path / "d" / ".cache").mkdir()  # a hidden folder is not a class
    ds = load(tmp_path / "d", test_fraction=0.2, val_fraction=0.2)
    assert ds.class_names == ("a", "b") and np.bincount(np.concatenate([ds.train.y, ds.val.y, ds.test.y])).tolist() == [
        5,
        5,
    ]


def test_one_colour_image_makes_the_dataset_rgb_and_grey_images_repeat_over_channels(tmp_path):
    write_imagefolder(tmp_path / "d", {"": {"a": 5, "b": 5}}, start=40)
    Image.new("RGB", (12, 10), (250, 0, 100)).save(tmp_path / "d" / "b" / "red.png")
    ds = load(tmp_path / "d", test_fraction=0.2, val_fraction=0.2)
    assert ds.input_shape == (3, 10, 12) and ds.preprocessing.startswith("RGB, 3 channels (1 of 11 images are colour)")
    every = np.concatenate([s.x for s in (ds.train, ds.val, ds.test)])
    x = (
        every * np.array(ds.normalization["std"], np.float32)[:, None, None]
        + np.array(ds.normalization["mean"], np.float32)[:, None, None]
    )
    pixels = sorted({tuple(round(float(v) * 255) for v in im[:, 0, 0]) for im in x})
    assert (250, 0, 100) in pixels and (40, 40, 40) in pixels and len(pixels) == 11


def test_sixteen_bit_grey_is_scaled_by_65535(tmp_path):
    for cls, value in (("a", 1000), ("b", 60000)):
        for k in range(5):
            (tmp_path / "d" / cls).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((6, 6), value + k, dtype=np.uint16)).save(tmp_path / "d" / cls / f"{k}.png")
    ds = load(tmp_path / "d", test_fraction=0.2, val_fraction=0.2)
    every = np.concatenate([s.x for s in (ds.train, ds.val, ds.test)])
    values = every[:, 0, 0, 0] * ds.normalization["std"][0] + ds.normalization["mean"][0]
    expected = [(v + k) / 65535 for v in (1000, 60000) for k in range(5)]
    assert sorted(values) == pytest.approx(sorted(expected), abs=1e-6)
    assert ds.input_shape == (1, 6, 6)


def test_mixed_sizes_are_an_error_naming_the_file_unless_image_size_resizes_them(tmp_path):
    write_imagefolder(tmp_path / "d", {"": {"a": 5, "b": 5}})
    odd = tmp_path / "d" / "b" / "002.png"
    Image.new("L", (8, 8), 9).save(odd)
    with pytest.raises(ConfigError) as err:
        load(tmp_path / "d")
    assert err.value.key == "data.path"
    assert str(err.value) == (
        f"config error: data.path: image {str(odd)!r} is 8x8 but {str(tmp_path / 'd' / 'a' / '000.png')!r} is 12x10: "
        "the images must share one size, or set data.image_size to resize every image to one square size"
    )
    ds = load(tmp_path / "d", image_size=16, test_fraction=0.2, val_fraction=0.2)
    assert ds.input_shape == (1, 16, 16)
    assert ds.preprocessing.endswith(
        "every image resized to 16x16 (data.image_size; PIL bilinear) from 2 sizes, 8x8 to 12x10"
    )


@pytest.mark.parametrize("content", [b"not a png at all", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"])
def test_an_unreadable_image_is_one_error_naming_it(tmp_path, content):
    write_imagefolder(tmp_path / "d", {"train": {"a": 5, "b": 5}, "test": {"a": 1, "b": 1}})
    bad = tmp_path / "d" / "test" / "b" / "zz.png"
    bad.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"cannot read image {str(bad)!r}: ") as err:
        load(tmp_path / "d")
    assert err.value.key == "data.path" and "\n" not in str(err.value)


def test_a_truncated_image_whose_header_reads_is_named_when_decoded(tmp_path):
    write_imagefolder(tmp_path / "d", {"": {"a": 5, "b": 5}})
    good = tmp_path / "d" / "a" / "001.png"
    noise = np.random.default_rng(0).integers(0, 256, (10, 12), dtype=np.uint8)
    Image.fromarray(noise).save(good)  # incompressible: most of the file is its IDAT
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])  # the IDAT cut short; Image.open still reads the header
    with pytest.raises(ConfigError, match=rf"cannot read image {str(good)!r}"):
        load(tmp_path / "d", test_fraction=0.2, val_fraction=0.2)


def test_empty_and_missing_folders_are_named(tmp_path):
    write_imagefolder(tmp_path / "d", {"train": {"a": 5, "b": 5}, "test": {"a": 2}})
    with pytest.raises(ConfigError, match=r"class 'b' has no folder .*test/b'"):
        load(tmp_path / "d")
    (tmp_path / "d" / "test" / "b").mkdir()
    (tmp_path / "d" / "test" / "b" / "readme.txt").write_text("x")
    with pytest.raises(
        ConfigError, match=r"class 'b': folder .*test/b' has no .png, .jpg or .jpeg images \(1 other file\)"
    ):
        load(tmp_path / "d")
    write_imagefolder(tmp_path / "one", {"train": {"a": 3}, "test": {"a": 1}})
    with pytest.raises(ConfigError, match=r"has 1 class folder \(a\); a classifier needs at least two"):
        load(tmp_path / "one")
    write_imagefolder(tmp_path / "half", {"train": {"a": 3, "b": 3}})
    with pytest.raises(ConfigError, match=r"has train/ but no test/"):
        load(tmp_path / "half")
    with pytest.raises(ConfigError, match=r"class 'c': folder .* does not exist") as err:
        load(tmp_path / "d", classes=["a", "c"])
    assert err.value.key == "data.classes"


def test_byte_identical_images_in_test_and_train_are_a_warning(tmp_path):
    write_imagefolder(tmp_path / "d", {"train": {"a": 5, "b": 5}, "test": {"a": 2, "b": 2}})
    (tmp_path / "d" / "test" / "a" / "copy.png").write_bytes((tmp_path / "d" / "train" / "b" / "003.png").read_bytes())
    ds = load(tmp_path / "d")
    assert ds.warnings == (
        "1 image of test/ is byte-identical to training images (first: test/a/copy.png = train/b/003.png): "
        "the held-out score counts them",
    )


@pytest.mark.parametrize("name", ["", "   ", "two\nlines", "x" * 81])
def test_a_display_name_must_be_one_printable_line(tmp_path, name):
    write_imagefolder(tmp_path / "d", {"": {"a": 5, "b": 5}})
    with pytest.raises(ConfigError, match="must be one printable line") as err:
        load(tmp_path / "d", display_name=name)
    assert err.value.key == "data.display_name"


@pytest.mark.parametrize("fmt", ["medmnist", "covid", "breast_cancer"])
def test_other_formats_refuse_a_display_name(tmp_path, fmt):
    with pytest.raises(ConfigError, match="is not used by data.name") as err:
        load_dataset(DataConfig(name=fmt, path=None if fmt == "breast_cancer" else str(tmp_path), display_name="x"))
    assert err.value.key == "data.display_name"
