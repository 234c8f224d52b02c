"""The engine folds each long input's windows into one vector when the request finishes: their mean weighted by tokens
(normalised if the input asked), other items' results passing through in their places; a request without windows is
left alone."""

from __future__ import annotations

import numpy as np

from service.engine.long_inputs import fold_windows, folder
from service.engine.tickets import Ticket
from service.tasks import EncodeItem, PooledVector, WindowItem


def window(length: int, source: int, normalize: bool = False) -> WindowItem:
    return WindowItem([1] * length, [0] * length, "mean", False, source=source, normalize_input=normalize)


def test_windows_of_each_input_fold_into_their_token_weighted_mean():
    items = [EncodeItem([1, 2], [0, 0], "mean", True), window(4, 1), window(2, 1), EncodeItem([3], [0], "cls"),
             window(3, 3, normalize=True), window(1, 3, normalize=True), window(5, 4)]
    vectors = [np.array(v, dtype=np.float32) for v in ([1, 0], [1, 1], [4, -2], [7, 7], [3, 0], [0, 4], [2, 2])]
    folded = fold_windows(items, [PooledVector(v) for v in vectors])
    assert len(folded) == 5
    np.testing.assert_allclose(folded[0].vector, [1, 0])
    np.testing.assert_allclose(folded[1].vector, (4 * np.array([1, 1]) + 2 * np.array([4, -2])) / 6)
    np.testing.assert_allclose(folded[2].vector, [7, 7])
    mean = (3 * np.array([3, 0]) + 1 * np.array([0, 4])) / 4
    np.testing.assert_allclose(folded[3].vector, mean / np.linalg.norm(mean), rtol=1e-6)
    np.testing.assert_allclose(folded[4].vector, [2, 2])
    assert folded[1].vector.dtype == np.float32


def test_a_ticket_folds_once_every_window_is_in():
    items = [window(2, 0), window(2, 0)]
    ticket = Ticket(0.0, len(items), sink=None, finish=folder(items))
    assert not ticket.record(1, PooledVector(np.array([0.0, 2.0], dtype=np.float32)), None)
    assert ticket.record(0, PooledVector(np.array([2.0, 0.0], dtype=np.float32)), None)
    assert len(ticket.results) == 1
    np.testing.assert_allclose(ticket.results[0].vector, [1.0, 1.0])
    assert folder([EncodeItem([1], [0])]) is None
