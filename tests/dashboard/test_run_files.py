"""The run folder's files as the dashboard reads them: appended records arrive, a torn last line waits
for its end, a rewritten (resumed) file is read again; transitions are written with their token runs
and cut back on resume."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from reinforge.store.run_files import METRICS_FILE, TRANSITIONS_FILE, RunFiles
from reinforge.training.transition_log import TransitionLog, token_segments
from reinforge.types import Transition

from .training_run import calc_tokenizer


def transition(rollout_id: str, index: int, ids: list[int], mask: list[int]) -> Transition:
    return Transition(
        rollout_id=rollout_id,
        attempt_id=f"a-{rollout_id}",
        index=index,
        prompt_ids=[1, 2, 3],
        response_ids=ids,
        response_mask=mask,
        behaviour_logprobs=[0.0] * len(ids),
        reward=0.5,
        final_reward=1.0,
        reward_sources={"equal": 1.0, "air": -0.5},
        advantage=0.25,
        num_calls=2,
    )


def test_metrics_arrive_as_appended_and_a_rewritten_file_is_read_again(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    assert files.metrics_since(0) == [] and files.metrics_count() == 0
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "train/reward": 0.5}\n{"step": 2, "train/rew', encoding="utf-8")
    assert files.metrics_since(0) == [{"step": 1, "train/reward": 0.5}]  # the torn line waits
    with path.open("a", encoding="utf-8") as f:
        f.write('ard": 0.75}\nnot json\n{"step": 3}\n')
    assert files.metrics_since(1) == [{"step": 2, "train/reward": 0.75}, {"step": 3}]
    path.write_text('{"step": 1, "train/reward": 0.25}\n', encoding="utf-8")  # a resume cut it back
    assert files.metrics_since(0) == [{"step": 1, "train/reward": 0.25}]


def test_no_run_folder_means_no_metrics_and_no_transitions() -> None:
    files = RunFiles(None)
    assert files.metrics_since(0) == [] and files.transitions_of("r") == []


def test_transitions_keep_their_credit_and_which_tokens_were_trained(tmp_path: Path) -> None:
    tokenizer: PreTrainedTokenizerFast = calc_tokenizer()
    ids = tokenizer.encode("1+2", add_special_tokens=False)
    tool = tokenizer.encode("result 3", add_special_tokens=False)
    mask = [1] * len(ids) + [0] * len(tool) + [1] * len(ids)
    t = transition("r1", 0, ids + tool + ids, mask)
    segments = token_segments(t, tokenizer)
    assert [(s.text, s.tokens, s.trained) for s in segments] == [
        ("1+2", len(ids), True),
        ("result 3", len(tool), False),
        ("1+2", len(ids), True),
    ]
    log = TransitionLog(tmp_path, tokenizer)
    log.write(1, [t, transition("r2", 0, ids, [1] * len(ids))])
    log.write(2, [transition("r1", 1, ids, [1] * len(ids))])
    files = RunFiles(tmp_path)
    first, second = files.transitions_of("r1")
    assert (first.step, first.index, second.step, second.index) == (1, 0, 2, 1)
    assert first.advantage == 0.25 and first.reward_sources == {"equal": 1.0, "air": -0.5}
    assert (first.response_tokens, first.trained_tokens, first.num_calls) == (len(mask), sum(mask), 2)
    log.truncate_after(1)  # a resume from step 1's checkpoint
    assert [r.step for r in files.transitions_of("r1")] == [1]
    lines = (tmp_path / TRANSITIONS_FILE).read_text().splitlines()
    assert [json.loads(x)["rollout_id"] for x in lines] == ["r1", "r2"]


def test_a_file_rewritten_past_its_old_end_is_read_again(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1}\n{"step": 2}\n', encoding="utf-8")
    assert [r["step"] for r in files.metrics_since(0)] == [1, 2]
    # A resume from step 1 cut the file back, then steps 2 and 3 landed before the next look.
    path.write_text('{"step": 1}\n{"step": 2, "redone": true}\n{"step": 3}\n', encoding="utf-8")
    assert files.metrics_since(0) == [{"step": 1}, {"step": 2, "redone": True}, {"step": 3}]
