"""The ledger's arithmetic (gpumagic.memory.census.ledger), without torch: categories settled when
a statement ends, replayed to its peak, and folded when a statement logs too much."""

from __future__ import annotations

import gpumagic.memory.census.ledger as ledger_module
from gpumagic.memory.census.categories import ACTIVATIONS, INPUTS, PARAMETERS, TEMPORARIES
from gpumagic.memory.census.ledger import BACKWARD, FORWARD, PENDING, Ledger, Record


def make(ledger: Ledger, key: int, n: int, born: int = FORWARD, module: int = 0) -> Record:
    rec = Record(key, n, PENDING, module, born, ledger.serial, ledger.statement)
    ledger.add(rec)
    return rec


def test_a_statement_settles_its_survivors_and_replays_its_peak_with_their_categories():
    ledger = Ledger()
    ledger.begin(0)
    param = make(ledger, 1, 1000)
    settled = ledger.settle(lambda recs: [ledger.move(r, PARAMETERS) for r in recs], 1)
    assert settled.after[PARAMETERS] == 1000 and settled.peak == 1000
    # statement 1: a forward pass keeps one tensor (module 7), makes and frees another
    kept = make(ledger, 2, 300, module=7)
    temp = make(ledger, 3, 500, module=7)
    ledger.drop(temp, by_backward=False)
    settled = ledger.settle(lambda recs: [ledger.move(r, ACTIVATIONS) for r in recs], 2)
    assert settled.peak == 1800
    assert settled.at_peak[ACTIVATIONS] == 300 and settled.at_peak[TEMPORARIES] == 500
    assert settled.modules_at_peak == {7: 300}
    assert settled.after[ACTIVATIONS] == 300 and settled.after[TEMPORARIES] == 0
    # statement 2: backward frees the activation and makes a gradient-sized buffer
    grad = make(ledger, 4, 1000, born=BACKWARD)
    ledger.drop(kept, by_backward=True)
    settled = ledger.settle(lambda recs: [ledger.move(r, INPUTS) for r in recs], 3)
    assert settled.at_peak[ACTIVATIONS] == 300  # still alive at the peak, gone after
    assert settled.after[ACTIVATIONS] == 0 and settled.after[INPUTS] == 1000
    assert ledger.by_module == {}
    assert param.alive and grad.alive and not kept.alive


def test_a_forward_tensor_freed_by_backward_in_the_same_statement_was_an_activation():
    ledger = Ledger()
    ledger.begin(0)
    act = make(ledger, 1, 400, module=3)
    make(ledger, 2, 100, born=BACKWARD)  # the peak: both alive
    ledger.drop(act, by_backward=True)
    settled = ledger.settle(lambda recs: [ledger.move(r, INPUTS) for r in recs], 1)
    assert settled.at_peak[ACTIVATIONS] == 400 and settled.modules_at_peak == {3: 400}


def test_a_statement_doing_nothing_settles_to_the_last_numbers():
    ledger = Ledger()
    ledger.begin(0)
    make(ledger, 1, 10)
    first = ledger.settle(lambda recs: [ledger.move(r, INPUTS) for r in recs], 1)
    again = ledger.settle(lambda recs: None, 2)
    assert again.after == first.after and again.at_peak is None and ledger.statement == 2


def test_a_statement_with_too_many_events_folds_its_log(monkeypatch):
    monkeypatch.setattr(ledger_module, "LOG_MAX", 8)
    ledger = Ledger()
    ledger.begin(0)
    recs = [make(ledger, k, 10) for k in range(20)]  # rises all along: folds on the way
    for r in recs[:10]:
        ledger.drop(r, by_backward=False)
    settled = ledger.settle(lambda rs: [ledger.move(r, INPUTS) for r in rs], 1)
    assert settled.peak == 200
    assert settled.after[INPUTS] == 100 and sum(settled.after) == ledger.current == 100
    # the peak came after the last fold: replayed from the fold, with the categories settled
    # for what came after it and those known at the fold for what came before
    assert not settled.approximate and sum(settled.at_peak) == 200
    # a peak before the fold, then only frees: the breakdown kept at the fold stands
    ledger.begin(2)
    more = [make(ledger, 100 + k, 10) for k in range(9)]  # the 9th is the peak, and folds
    for r in more:
        ledger.drop(r, by_backward=False)
    settled = ledger.settle(lambda rs: None, 3)
    assert settled.approximate and settled.peak == 190
    assert settled.at_peak[INPUTS] == 100 and settled.at_peak[TEMPORARIES] == 90


def test_a_detailed_ledger_names_each_storage_alive_at_the_peak_adding_up_to_it():
    """What %%memfit's dry run reads: each storage alive at a statement's peak with its
    category then (an earlier storage moved after the peak keeps its category then)."""
    ledger = Ledger(detail=True)
    ledger.begin(-1)
    param = make(ledger, 1, 1000)
    ledger.move(param, PARAMETERS)
    named = make(ledger, 2, 50)
    ledger.move(named, INPUTS)
    ledger.begin(0)
    assert Ledger().alive_now() is None  # without detail, nothing is kept
    assert {(r.key, c, n) for r, c, n in ledger.alive_now()} == {(1, PARAMETERS, 1000), (2, INPUTS, 50)}
    act = make(ledger, 3, 300, module=7)
    temp = make(ledger, 4, 500, module=7)  # the peak: 1850
    ledger.drop(temp, by_backward=False)
    ledger.move(named, ACTIVATIONS)  # after the peak: its name went
    settled = ledger.settle(lambda recs: [ledger.move(r, ACTIVATIONS) for r in recs], 1)
    alive = {(r.key, c, n) for r, c, n in settled.alive_at_peak}
    assert alive == {(1, PARAMETERS, 1000), (2, INPUTS, 50), (3, ACTIVATIONS, 300), (4, TEMPORARIES, 500)}
    by_category = [0] * len(settled.at_peak)
    for _, c, n in settled.alive_at_peak:
        by_category[c] += n
    assert tuple(by_category) == settled.at_peak and sum(by_category) == settled.peak == 1850
    assert act.alive and [r.key for r, _, _ in ledger.alive_now()] == [1, 2, 3]
