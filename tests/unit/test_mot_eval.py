"""The MOT scores of tests/mot_eval.py on cases small enough to count by hand."""

from __future__ import annotations

import pytest

from mot_eval import evaluate

pytest.importorskip("scipy", reason="scipy (the dev extra) computes the MOT scores' optimal pairings")

A = (0, 0, 10, 10)
B = (100, 0, 110, 10)


def test_a_perfect_tracker_scores_one():
    truth = [[(1, A, False), (2, B, False)]] * 4
    predicted = [[("x", A), ("y", B)]] * 4
    scores = evaluate(truth, predicted)
    assert scores.idf1 == 1.0 and scores.id_switches == 0 and scores.idtp == 8


def test_an_id_that_changes_halfway_is_one_switch_and_half_the_id_matches():
    # truth 1 for 4 frames; predicted "x" for 2 frames, then "z": the best pairing (1, x) holds
    # 2 frames, so IDTP 2 of 4 truth and 4 predicted boxes: IDF1 = 2*2 / (4 + 4) = 0.5
    truth = [[(1, A, False)]] * 4
    predicted = [[("x", A)]] * 2 + [[("z", A)]] * 2
    scores = evaluate(truth, predicted)
    assert scores.id_switches == 1
    assert scores.idtp == 2 and scores.idf1 == pytest.approx(0.5)


def test_two_tracks_swapping_objects_are_two_switches():
    truth = [[(1, A, False), (2, B, False)]] * 2
    predicted = [[("x", A), ("y", B)], [("y", A), ("x", B)]]
    scores = evaluate(truth, predicted)
    assert scores.id_switches == 2
    assert scores.idtp == 2 and scores.idf1 == pytest.approx(2 * 2 / 8)


def test_missed_and_spurious_boxes_count_against_idf1():
    # 3 truth boxes, one missed; one box far from any object: IDTP 2, IDF1 = 4 / (3 + 3)
    truth = [[(1, A, False)]] * 3
    predicted = [[("x", A)], [("x", A), ("s", B)], []]
    scores = evaluate(truth, predicted)
    assert scores.idtp == 2 and scores.false_negatives == 1 and scores.false_positives == 1
    assert scores.idf1 == pytest.approx(4 / 6)


def test_difficult_objects_count_neither_way():
    truth = [[(1, A, True)], [(1, A, True)]]
    assert evaluate(truth, [[("x", A)], []]) == evaluate(truth, [[], []])
    assert evaluate(truth, [[], []]).truth_boxes == 0


def test_one_id_on_two_boxes_of_a_frame_pairs_once():
    truth = [[(1, A, False), (2, B, False)]]
    scores = evaluate(truth, [[("x", A), ("x", B)]])
    assert scores.idtp == 1 and scores.predicted_boxes == 2
