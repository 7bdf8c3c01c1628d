"""``--repeat N``'s runs merged into one result, and the notes shown above a profile: the
core's part of ``%%gpuprofile``'s ending (``profile/record/repeat.py``, ``finish.py``), used
here as a script would, on real traces (the magic's use of it: test_magic_repeat_verdicts.py).
"""

from __future__ import annotations

import pytest

from gpumagic.profile.record.finish import Finished
from gpumagic.profile.record.repeat import Repeats

RUNS = ("a100_training_control.json.gz", "v100_training_test.json.gz", "v100_training_5steps.json.gz")


def test_runs_before_the_last_are_samples_of_the_last(load):
    first, second, last = (load(name) for name in RUNS)
    repeats = Repeats(3)
    lasts = list(repeats)
    assert lasts == [False, False, True]
    assert repeats.end(Finished(first, analysed=True), lasts[0]) is None  # kept, not shown
    assert repeats.end(Finished(second, analysed=True), lasts[1]) is None
    done = repeats.end(Finished(last, analysed=True), lasts[2])
    assert done is not None and done.reported and done.notes() == []
    merged = done.result
    assert merged is not last and merged.runs[:2] == [first, second] and merged.runs[2] is merged
    assert merged.summary.runs == 3 and [len(s) for s in merged.step_samples] == [
        len(r.steps) for r in (first, second, last)
    ]
    assert merged.ops.equals(last.ops)  # the tables are the last run's
    assert last.earlier_runs == []  # the run's own result is left as it was


def test_a_failing_run_ends_the_repeats_holding_the_runs_before_it(load):
    first, failed = load(RUNS[0]), load(RUNS[2])
    repeats = Repeats(3)
    assert repeats.end(Finished(first, analysed=True), last=False) is None
    done = repeats.end(Finished(failed, analysed=True, cell_error="ValueError: boom"), last=False)
    assert done is not None and done.reported
    assert done.result.runs[0] is first and len(done.result.runs) == 2
    assert done.notes() == ["The cell failed (ValueError: boom); the profile covers what ran before."]


def test_a_run_without_a_report_says_why_and_is_no_sample(load):
    repeats = Repeats(2)
    partial = Finished(load(RUNS[2]), problems=["the analysis failed (KeyError: 'x')"])
    done = repeats.end(partial, last=False)
    assert done is partial and not done.reported and repeats.earlier == []
    assert done.notes() == ["%%gpuprofile: the analysis failed (KeyError: 'x')"]
    # nothing recorded and no problem to say why: the note says so
    assert Finished().notes() == ["%%gpuprofile: no profile was recorded"]
    assert Finished(cell_error="KeyboardInterrupt").notes() == [
        "The cell failed (KeyboardInterrupt); the profile covers what ran before.",
        "%%gpuprofile: no profile was recorded",
    ]


def test_repeat_needs_a_run():
    with pytest.raises(ValueError, match="--repeat must be at least 1"):
        Repeats(0)
