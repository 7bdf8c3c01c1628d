"""%%memfit's warm dry run against the real training step it predicts, model by model.

Models (issues 26 item 8 and 27 item 3: each one whose real CPU step takes 0.2-2 s here):
  the five families of tests/memfit/memfit_models.py (MLP, CNN with batch norm, transformer
  encoder, LSTM, residual network; Adam), each at a batch that puts its real step in that
  range, and GPT-2 and BERT built from transformers' configs (4 layers, width 256, vocabulary
  8000, sequence 128; AdamW), when transformers is installed. Nothing is downloaded.
Runners, both through one IPython shell with gpumagic loaded, on the same namespace:
  memfit - the cell under ``%%memfit -q`` with no target: the dry run, the headroom and the
           verdict of every card of the table (the magic's default), nothing allocated
  real   - the same cell run for real (it trains the model, as the notebook's cell does)
Each model first runs once each way (warm: imports, fake kernels' caches, and the state a
notebook has after its first real step: the optimizer's moments, the last batch), then in
alternating pairs (memfit, real, memfit, ...); each pair gives memfit / real. Per model:
the median of its pairs with the median's 95% CI (ratios.py); over models: the median of
those medians, with a 95% interval from drawing each model's pairs again (the run's noise,
for these models), and the target (<= 0.5, the issues' bar) holds against it. Time is the main thread's CPU time,
torch single-threaded (the dry run is one thread; the machine is 2 cores shared); wall-clock
ratios are printed beside it. The caching allocator's model must replay each run's
allocations once (one %%memfit, sixteen cards): the replays are counted for every run.

    python benchmarks/bench_memfit.py [--repeats 7] [--models mlp,gpt2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "memfit"))  # the model families the tests check
from ratios import describe, load_average, median_ci  # noqa: E402  (beside this file)

TARGET_RATIO = 0.5
STEP_RANGE = (0.2, 2.0)  # seconds: the real steps the target is about

# name -> batch: the families of memfit_models.py at a batch whose real step (one thread, this
# machine) takes 0.25-0.6 s; the transformers models at batch 4 of 128 tokens (0.4-0.5 s)
FAMILY_BATCHES = {"mlp": 4096, "cnn_batchnorm": 256, "transformer": 128, "lstm": 256, "resnet": 128}
HF_BATCH, HF_SEQUENCE, HF_VOCABULARY = 4, 128, 8000

HF_CELL = """\
ids = torch.randint(0, V, (B, L))
out = model(input_ids=ids, labels={labels})
out.loss.backward()
optimizer.step()
optimizer.zero_grad()
"""


def family(name: str) -> tuple[dict[str, Any], str]:
    from memfit_models import namespace, train_cell

    return namespace(name, "adam", batch=FAMILY_BATCHES[name]), train_cell(name)


def transformers_model(kind: str) -> tuple[dict[str, Any], str]:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":
        config: Any = transformers.GPT2Config(
            n_layer=4, n_embd=256, n_head=4, vocab_size=HF_VOCABULARY, n_positions=512,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model: Any = transformers.GPT2LMHeadModel(config)
        labels = "ids"
    else:
        config = transformers.BertConfig(
            hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
            vocab_size=HF_VOCABULARY, max_position_embeddings=512,
        )  # fmt: skip
        model = transformers.BertForSequenceClassification(config)
        labels = "torch.randint(0, 2, (B,))"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ns = {"torch": torch, "model": model, "optimizer": optimizer, "B": HF_BATCH, "L": HF_SEQUENCE, "V": HF_VOCABULARY}
    return ns, HF_CELL.format(labels=labels)


def models() -> dict[str, Callable[[], tuple[dict[str, Any], str]]]:
    import importlib.util

    found: dict[str, Callable[[], tuple[dict[str, Any], str]]] = {
        name: (lambda name=name: family(name)) for name in FAMILY_BATCHES
    }
    if importlib.util.find_spec("transformers") is not None:
        found["gpt2"] = lambda: transformers_model("gpt2")
        found["bert"] = lambda: transformers_model("bert")
    return found


class Replays:
    """Counts the caching allocator model's replays (AllocatorModel.replay) while it lasts."""

    def __init__(self) -> None:
        from gpumagic.memory.fit.allocator import AllocatorModel

        self.model = AllocatorModel
        self.original = AllocatorModel.replay
        self.count = 0

    def __enter__(self) -> Replays:
        original = self.original

        def counted(model: Any, trace: Any) -> Any:
            self.count += 1
            return original(model, trace)

        self.model.replay = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.model.replay = self.original  # type: ignore[method-assign]


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - cpu, time.perf_counter() - wall


def measure(shell: Any, make: Callable[[], tuple[dict[str, Any], str]], repeats: int) -> dict[str, Any]:
    ns, cell = make()
    for name in [n for n in shell.user_ns if not n.startswith("_") and n not in shell.user_ns_hidden]:
        del shell.user_ns[name]  # the previous model's names
    shell.user_ns.update(ns)

    def memfit() -> None:
        r = shell.run_cell("%%memfit -q\n" + cell, store_history=False, silent=True)
        if not r.success:
            raise RuntimeError(f"%%memfit failed: {r.error_in_exec or r.error_before_exec}")

    def real() -> None:
        r = shell.run_cell(cell, store_history=False, silent=True)
        if not r.success:
            raise RuntimeError(f"the cell failed: {r.error_in_exec or r.error_before_exec}")

    real()  # the notebook's state after a first step, then first-call costs, outside the timings
    memfit()
    cpu, wall, steps, replays = [], [], [], []
    for _ in range(repeats):
        with Replays() as counted:
            fit_cpu, fit_wall = _timed(memfit)
        replays.append(counted.count)
        real_cpu, real_wall = _timed(real)
        cpu.append(fit_cpu / real_cpu)
        wall.append(fit_wall / real_wall)
        steps.append(real_cpu)
    fit = shell.user_ns["_memfit"]
    return {
        "cpu_ratios": cpu, "wall_ratios": wall, "real_step_cpu_s": steps, "replays": replays,
        "peak_bytes": fit.peak_bytes, "cards": len(fit.verdicts),
    }  # fmt: skip


def median_over_models_ci(pairs: list[list[float]], draws: int = 2000) -> tuple[float, float]:
    """95% percentile interval of the median over models, drawing each model's pairs again
    with replacement (the run's noise; the choice of models is fixed)."""
    rng = random.Random(0)
    got = sorted(
        statistics.median(statistics.median(rng.choices(ratios, k=len(ratios))) for ratios in pairs)
        for _ in range(draws)
    )
    return got[int(0.025 * draws)], got[int(0.975 * draws) - 1]


def judged(median: float, low: float, target: float) -> tuple[bool, str]:
    """(failed, text) as :func:`ratios.verdict` words it, for the median over models."""
    head = f"target: median over models <= {target:g} -> "
    if median <= target:
        return False, head + "met"
    if low <= target:
        return False, head + f"not judged: {median:.3f} misses, but its interval holds the target (rerun)"
    return True, head + "NOT met"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="pairs per model")
    parser.add_argument("--models", default=None, help="a comma-separated subset of the models")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch
    from IPython.core.interactiveshell import InteractiveShell

    torch.set_num_threads(1)
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext gpumagic", store_history=False)
    available = models()
    chosen = args.models.split(",") if args.models else list(available)
    unknown = [m for m in chosen if m not in available]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(available)}")
    if "gpt2" not in available:
        print("transformers is not installed: GPT-2 and BERT left out (pip install -e '.[test]')")
    print(f"before: {load_average()}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for name in chosen:
        results[name] = res = measure(shell, available[name], args.repeats)
        step = statistics.median(res["real_step_cpu_s"])
        lo, hi = median_ci(res["cpu_ratios"])
        outside = "" if STEP_RANGE[0] <= step <= STEP_RANGE[1] else "  (step outside 0.2-2 s here)"
        print(
            f"{name:<14} real step {step:5.2f} s{outside}  predicted peak {res['peak_bytes'] / 2**20:7.1f} MiB  "
            f"memfit / real: median {statistics.median(res['cpu_ratios']):.3f} (95% CI {lo:.3f}..{hi:.3f}), "
            f"wall {statistics.median(res['wall_ratios']):.3f}",
            flush=True,
        )
    print(f"after: {load_average()}")
    medians = [statistics.median(r["cpu_ratios"]) for r in results.values()]
    overall = statistics.median(medians)
    lo, hi = median_over_models_ci([r["cpu_ratios"] for r in results.values()])
    print(f"per-model medians of memfit / real step (CPU time): {describe(medians)}")
    print(
        f"median over {len(medians)} models: {overall:.3f} (95% interval {lo:.3f}..{hi:.3f}, "
        "resampling each model's pairs)"
    )
    failed, text = judged(overall, lo, TARGET_RATIO)
    print(text)
    runs = [n for r in results.values() for n in r["replays"]]
    cards = {r["cards"] for r in results.values()}
    replays_ok = all(n == 1 for n in runs)
    print(
        f"allocator replays per %%memfit run: {sorted(set(runs))} over {len(runs)} runs, each judging "
        f"{'/'.join(map(str, sorted(cards)))} cards -> {'met' if replays_ok else 'NOT met'} (target: 1)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({
            "models": results, "medians": medians, "median": overall, "interval": [lo, hi],
            "target": TARGET_RATIO, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        }), encoding="utf-8")  # fmt: skip
    return int(failed or not replays_ok)


if __name__ == "__main__":
    sys.exit(main())
