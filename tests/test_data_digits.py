"""The ``digits`` dataset: scikit-learn's UCI handwritten digits, split by seed.

scikit-learn is an optional dependency (``pip install -e '.[data]'``, which
``scripts/install.sh`` installs, so these tests fail rather than skip when it is
missing); the missing-package test simulates its absence with an import that fails.
"""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from research.data import DataError, dataset_options, get_dataset
from research.data.digits import REQUIREMENT, stratified_split


def test_shapes_dtypes_and_sizes():
    ds = get_dataset("digits")
    assert ds.input_shape == (8, 8, 1) and ds.num_classes == 10
    assert ds.n_train + ds.n_test == 1797
    assert ds.n_test == pytest.approx(0.2 * 1797, abs=10)
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
    assert ds.train_x.shape == (ds.n_train, 8, 8, 1)
    # normalised with the training statistics: train pixels have mean 0, std 1
    assert abs(float(ds.train_x.mean())) < 1e-4
    assert float(ds.train_x.std()) == pytest.approx(1.0, rel=1e-4)
    assert "digits: " in ds.describe() and "(8, 8, 1)" in ds.describe()


def test_split_is_deterministic_stratified_and_seeded():
    a, b = get_dataset("digits", seed=3), get_dataset("digits", seed=3)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    np.testing.assert_array_equal(a.test_y, b.test_y)
    c = get_dataset("digits", seed=4)
    assert not np.array_equal(a.test_x, c.test_x)
    # every class is in the test split in the same share (about 36 of ~180)
    counts = np.bincount(a.test_y, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38


def test_split_indices_are_disjoint_and_cover_everything():
    labels = np.repeat(np.arange(10), 17)
    train, test = stratified_split(labels, 0.25, seed=0)
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(
        np.sort(np.concatenate([train, test])), np.arange(170)
    )
    assert np.all(np.bincount(labels[test]) == 4)


def test_unnormalised_values_and_upsampling():
    raw = get_dataset("digits", normalize=False)
    assert raw.train_x.min() == 0.0 and raw.train_x.max() == 1.0
    big = get_dataset("digits", normalize=False, image_size=16)
    assert big.input_shape == (16, 16, 1)
    # nearest neighbour: every 2x2 block is one original pixel
    np.testing.assert_array_equal(big.train_x[:, ::2, ::2], raw.train_x)
    np.testing.assert_array_equal(big.train_x[:, 1::2, 1::2], raw.train_x)


def test_bad_options_are_data_errors():
    assert dataset_options("digits")["image_size"] == 8
    with pytest.raises(DataError, match="multiple of 8"):
        get_dataset("digits", image_size=12)
    with pytest.raises(DataError, match="test_fraction"):
        get_dataset("digits", test_fraction=1.0)


def test_missing_scikit_learn_is_one_line_naming_package_and_pip(monkeypatch):
    real_import = builtins.__import__

    def no_sklearn(name, *args, **kwargs):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    with pytest.raises(DataError) as e:
        get_dataset("digits")
    message = str(e.value)
    assert "\n" not in message
    assert "scikit-learn" in message and f"pip install '{REQUIREMENT}'" in message
