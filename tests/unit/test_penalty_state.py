"""Incremental penalty inputs: the state a sequence keeps token by token equals a full rescan of its
histories, build_batch creates it once and only for penalized sequences, and the sampling arrays
built from it are the ones a rescan would give."""

from __future__ import annotations

from collections import Counter

import numpy as np

from lantern.app.engine.batch import build_batch
from lantern.app.engine.penalty_state import PenaltyState
from lantern.app.engine.sampling_params import SamplingParams
from lantern.app.engine.scheduler import ScheduledSeq, SchedulerOutput
from lantern.app.engine.sequence import Sequence
from lantern.backends.sampling_prep import prepare_sampling


def check_matches_rescan(state: PenaltyState, prompt: list[int], output: list[int]) -> None:
    assert np.array_equal(np.sort(state.seen_ids()), np.unique(prompt + output))
    assert len(state.seen_ids()) == len(set(prompt + output))  # no id twice
    assert dict(zip(state.output_ids().tolist(), state.output_counts().tolist(), strict=True)) == Counter(output)
    assert state.num_output == len(output)


def test_appends_match_a_rescan_of_the_histories():
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 50, 40).tolist()
    state = PenaltyState(prompt)
    output: list[int] = []
    for _ in range(300):  # past the arrays' first growth
        token = int(rng.integers(0, 120))
        state.append(token)
        output.append(token)
        check_matches_rescan(state, prompt, output)
    from_scratch = PenaltyState(prompt, output)
    check_matches_rescan(from_scratch, prompt, output)


def _schedule(*seqs: Sequence) -> SchedulerOutput:
    for s in seqs:
        s.block_table = [0, 1, 2, 3]
        s.num_computed_tokens = s.num_tokens - 1  # a decode step: samples
    return SchedulerOutput(scheduled=[ScheduledSeq(s, 1) for s in seqs])


def test_build_batch_makes_the_state_once_and_append_token_feeds_it():
    penalized = Sequence("a", [3, 4, 4, 9], SamplingParams(frequency_penalty=0.5, repetition_penalty=1.2))
    plain = Sequence("b", [3, 4], SamplingParams())
    penalized.append_token(11)  # before any state exists
    batch = build_batch(_schedule(penalized, plain), block_size=4, banned={})
    state = penalized.penalty
    assert isinstance(state, PenaltyState) and batch.sampling[0].penalty is state
    assert plain.penalty is None and batch.sampling[1].penalty is None
    check_matches_rescan(state, [3, 4, 4, 9], [11])
    for t in (4, 12, 12):
        penalized.append_token(t)
    check_matches_rescan(state, [3, 4, 4, 9], [11, 4, 12, 12])
    again = build_batch(_schedule(penalized), block_size=4, banned={})
    assert again.sampling[0].penalty is state  # kept, not rebuilt
    assert again.sampling[0].step == 4


def test_sampling_arrays_from_the_state_equal_a_rescan():
    vocab = 64
    rng = np.random.default_rng(1)
    seqs = []
    for i, kw in enumerate(
        [
            {"repetition_penalty": 1.3},
            {"frequency_penalty": 0.7, "presence_penalty": -0.4},
            {},
            {"repetition_penalty": 0.8, "presence_penalty": 1.0},
        ]
    ):
        s = Sequence(f"r{i}", rng.integers(0, vocab, 12).tolist(), SamplingParams(**kw))
        for t in rng.integers(0, vocab, 20).tolist():
            s.append_token(t)
        seqs.append(s)
    rows = build_batch(_schedule(*seqs), block_size=16, banned={}).sampling
    a = prepare_sampling(rows, vocab)
    rep: dict[int, float] = {}
    sub: dict[int, float] = {}
    for i, s in enumerate(seqs):
        p = s.params
        if p.repetition_penalty != 1.0:
            rep.update({i * vocab + t: p.repetition_penalty for t in set(s.prompt_token_ids + s.output_token_ids)})
        if p.frequency_penalty or p.presence_penalty:
            sub.update(
                {
                    i * vocab + t: c * p.frequency_penalty + p.presence_penalty
                    for t, c in Counter(s.output_token_ids).items()
                }
            )
    assert a.rep_flat is not None and a.rep_values is not None and a.freq_flat is not None
    expected_rep = {k: np.float32(v) for k, v in rep.items()}
    assert dict(zip(a.rep_flat.tolist(), a.rep_values.tolist(), strict=True)) == expected_rep
    got = dict(zip(a.freq_flat.tolist(), a.freq_values.tolist(), strict=True))
    assert got.keys() == sub.keys() and all(abs(got[k] - v) < 1e-6 for k, v in sub.items())
    assert len(a.rep_flat) == len(rep) and len(a.freq_flat) == len(sub)
