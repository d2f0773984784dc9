"""Mutation score: realistic one-line bugs put into distlab, one at a time, and whether the tests
named for that behaviour catch them.

Each mutation replaces one exact line fragment in one module, runs the test files that cover it
(pytest -x, stopping at the first failure), and restores the module, whatever happens. A
mutation is *caught* when the tests fail. Run it on a quiet machine (it runs real ranks):

    .venv/bin/python bench/mutation_score.py              # all mutations
    .venv/bin/python bench/mutation_score.py 3 7          # only these (numbers from the table)

Prints one row per mutation and the score. The list is the bugs a maintainer could plausibly
write, on every layer: the rank machinery, errors, output, timeline, memory, exercises, doctor.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    Mutation(
        "Cluster.run/exec/%%ranks ignore the per-call timeout",
        "distlab/cluster.py",
        "timeout = self.timeout if timeout is None else _config.check_timeout(timeout)",
        "timeout = self.timeout",
        ("tests/test_cluster.py",),
    ),
    Mutation(
        "the watch thread does not end the rank when the kernel goes",
        "distlab/_ranks/rank.py",
        # (not `os.killpg(...)` -> `return`: the `finally: os._exit(1)` after it still ends the
        # rank, an equivalent mutant that no test can catch)
        "# The kernel closed our lifeline: it shut us down, restarted, or was killed.",
        "return  # the kernel closed our lifeline",
        ("tests/test_lifelines.py",),
    ),
    Mutation(
        "memory.measure counts two Parameters over one storage twice",
        "distlab/memory.py",
        "key = (local.data_ptr(), local.numel()) if local.numel() else id(p)",
        "key = id(p)",
        ("tests/test_memory.py",),
    ),
    Mutation(
        "doctor ticks loopback whatever the ranks listen on",
        "distlab/doctor.py",
        "        not public,\n",
        "        True,\n",
        ("tests/test_doctor.py",),
    ),
    Mutation(
        "folding groups only neighbouring ranks",
        "distlab/_output.py",
        "groups.setdefault(values[r], []).append(r)",
        "groups.setdefault((values[r], r if r and values.get(r - 1) != values[r] else 0), [])"
        ".append(r)",
        ("tests/test_output.py",),
    ),
    Mutation(
        "root causes reported in the order they arrived, not in rank order",
        "distlab/errors.py",
        # (not dropping "Connection closed by peer" from the pattern: "closed by peer" further
        # on matches the same messages, an equivalent mutant)
        "roots = sorted((f for f in failures if not f.consequence), key=lambda f: f.rank)",
        "roots = [f for f in failures if not f.consequence]",
        ("tests/test_errors.py",),
    ),
    Mutation(
        "a task's end marker is left in its output",
        "distlab/_ranks/proc.py",
        # (not in `rest`, what follows the marker: the next task starts with an empty buffer,
        # so that was an equivalent mutant)
        "out = bytes(self.buf[:idx])",
        "out = bytes(self.buf[: idx + len(mark)])",
        ("tests/test_launcher.py", "tests/test_cluster.py"),
    ),
    Mutation(
        "ranks' blocks printed in reverse rank order",
        "distlab/_output.py",
        '        return "".join(prefix(r, outputs[r]) for r in sorted(outputs) if outputs[r])',
        '        return "".join(prefix(r, outputs[r]) for r in sorted(outputs)[::-1] '
        "if outputs[r])",
        ("tests/test_output.py", "tests/test_launcher.py"),
    ),
    Mutation(
        "timeline compute counts time blocked in a wait",
        "distlab/timeline/metrics.py",
        'if e.kind in ("comm", "wait")',
        'if e.kind in ("comm",)',
        ("tests/test_timeline_metrics.py",),
    ),
    Mutation(
        "timeline wait sums collectives instead of their union",
        "distlab/timeline/timeline.py",
        "return length(union([x for _, iv in self._wait_intervals(rank) for x in iv]))",
        "return sum(length(iv) for _, iv in self._wait_intervals(rank))",
        ("tests/test_timeline_metrics.py",),
    ),
    Mutation(
        "check calls a skeleton wrong instead of not attempted",
        "distlab/exercises/__init__.py",
        "        return _not_attempted(label, str(e))",
        '        return _wrong(label, "not implemented")',
        ("tests/test_exercises.py",),
    ),
    Mutation(
        "expect.same compares lists with zip alone",
        "distlab/exercises/expect.py",
        "        if len(got) != len(want):",
        "        if False:",
        ("tests/test_exercise_mistakes.py",),
    ),
    Mutation(
        "world_size=0 accepted",
        "distlab/_config.py",
        'check_int(world_size, "world_size", low=1,',
        'check_int(world_size, "world_size", low=0,',
        ("tests/test_launcher.py",),
    ),
    Mutation(
        "restart does not replay what set the ranks up",
        "distlab/cluster.py",
        "        history = self._history if replay else []",
        "        history = []",
        ("tests/test_cluster.py", "tests/test_exercise_mistakes.py"),
    ),
    Mutation(
        "killing a rank leaves what it started running",
        "distlab/_ranks/proc.py",
        "        for kill in (os.killpg, os.kill):",
        "        for kill in (os.kill,):",
        ("tests/test_launcher.py",),
    ),
    Mutation(
        "the timeout counts from the submit, not from when the ranks began",
        "distlab/_ranks/group.py",
        "                began = max([task.started, *task.began.values()])",
        "                began = task.started",
        ("tests/test_launcher.py",),
    ),
    Mutation(
        "cell numbers left in the text nbval compares",
        "distlab/_readable.py",
        """        return f'File "<cell>", line {line}'""",
        """        return f"Cell In[{numbers[filename]}], line {line}\"""",
        ("tests/test_magic.py",),
    ),
    Mutation(
        "an argument that cannot be pickled is blamed on the function",
        "distlab/_ranks/ship.py",
        '        parts += [(f"positional argument {i} ({type(a).__name__})", a) for i, a in '
        "enumerate(args)]",
        "        parts += []",
        ("tests/test_launcher.py",),
    ),
    Mutation(
        "the start limit is never enforced",
        "distlab/_ranks/group.py",
        "        if task.unstarted and not task.failures:",
        "        if False:",
        ("tests/test_launcher.py",),
    ),
    Mutation(
        "a hang on the ranks is not called a hang by check",
        "distlab/exercises/__init__.py",
        "        return _wrong(label, _hang(e))",
        "        raise",
        ("tests/test_exercises.py",),
    ),
    # -- Part III (#33): behaviours no test checked, each mutation survived before its test --
    Mutation(
        "a passing gradcheck report gives the last tensor's relative error, not the largest",
        "distlab/gradcheck/compare.py",
        "worst[0], worst[1] = max(worst[0], abs_err), max(worst[1], rel_err)",
        "worst[0], worst[1] = max(worst[0], abs_err), rel_err",
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "gradcheck compares the gradients before the loss (a forward mistake named late)",
        "distlab/gradcheck/compare.py",
        '_KINDS = ("loss", "grads", "params", "state")',
        '_KINDS = ("grads", "loss", "params", "state")',
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "layers.1 of an activation count includes layers.10 and layers.11",
        "distlab/activations/result.py",
        'return module == "" or name == module or name.startswith(module + ".")',
        'return module == "" or name == module or name.startswith(module)',
        ("tests/test_activations.py",),
    ),
    Mutation(
        "side_by_side shows predicted minus measured",
        "distlab/activations/result.py",
        'f"{m - p:+,}"))',
        'f"{p - m:+,}"))',
        ("tests/test_activations.py",),
    ),
    Mutation(
        "make_optimizer's AdamW has torch's default betas, not the documented (0.9, 0.95)",
        "distlab/gpt.py",
        "return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)",
        "return torch.optim.AdamW(params, lr=lr, weight_decay=0.1)",
        ("tests/test_gpt.py",),
    ),
    Mutation(
        "reference_run ignores its learning rate",
        "distlab/gpt.py",
        "opt = make_optimizer(model.parameters(), optimizer, lr)",
        "opt = make_optimizer(model.parameters(), optimizer)",
        ("tests/test_gpt.py", "tests/test_gradcheck.py"),
    ),
    Mutation(
        "ZeRO shards over the data-parallel ranks only, not dp x cp",
        "distlab/calculators/memory_estimate.py",
        'shards = {"dense": (dense, dp * cp), "expert": (expert, dp * cp // ep)}',
        'shards = {"dense": (dense, dp), "expert": (expert, dp // ep)}',
        ("tests/test_calculators.py",),
    ),
    Mutation(
        "a mixture of experts' insides counted for one expert per token, not top_k",
        "distlab/calculators/activation_terms.py",
        '("experts\' insides", 4 * e * s * b * k * i)',
        '("experts\' insides", 4 * e * s * b * i)',
        ("tests/test_calculators.py",),
    ),
    Mutation(
        "a tied embedding's copy on the last pipeline stage is not counted",
        "distlab/calculators/models.py",
        "if not self.tied or pp > 1:",
        "if not self.tied:",
        ("tests/test_calculators.py",),
    ),
    Mutation(
        "a vocabulary that tp does not divide is split rounding down",
        "distlab/calculators/models.py",
        "    return -(-n // parts)",
        "    return n // parts",
        ("tests/test_calculators.py",),
    ),
    Mutation(
        "a one-element parameter's step counter counted as optimizer state",
        "distlab/memory.py",
        "if value.dim() > 0 and _local(value).numel() == size:",
        "if _local(value).numel() == size:",
        ("tests/test_calculators.py", "tests/test_memory.py"),
    ),
    # -- the optimizer-aware gradcheck (#33) --
    Mutation(
        "gradcheck allows parameters nothing for the gradients' rounding (the old rule)",
        "distlab/gradcheck/compare.py",
        'allow = {r: _allowance(kind, name, r, context["drifts"]) for r in holders}',
        "allow = dict.fromkeys(holders, 0.0)",
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "gradcheck does not compare the optimizer's settings",
        "distlab/gradcheck/compare.py",
        "            why = differences(mine[name], want[name])",
        "            why = None",
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "gradcheck holds later steps' gradients to rtol whatever the parameters moved",
        "distlab/gradcheck/compare.py",
        'tol = rtol + min(GROWTH * moved, 10 * rtol) if kind in ("loss", "grads") else rtol',
        "tol = rtol",
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "Adam's allowance takes the rank's sqrt(v) to be one process's",
        "distlab/gradcheck/optimizers.py",
        "root, low = v.sqrt(), (v - dv).clamp(min=0).sqrt()",
        "root, low = v.sqrt(), v.sqrt()",
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "SGD's allowance forgets Nesterov's extra gradient term",
        "distlab/gradcheck/optimizers.py",
        'step_diff = dg + momentum * self._buf if setting.get("nesterov") else self._buf',
        "step_diff = self._buf",
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "DISTLAB_AS_MACOS=0 turns the macOS rules on",
        "distlab/_ranks/forksafety.py",
        'os.environ.get(ENV_AS_MACOS, "").strip() not in ("", "0")',
        "os.environ.get(ENV_AS_MACOS) is not None",
        ("tests/test_forksafety.py",),
    ),
    Mutation(
        "guard_mps leaves mps.is_built unguarded",
        "distlab/_ranks/forksafety.py",
        "    mps.is_built = refuse",
        "    pass",
        ("tests/test_forksafety.py",),
    ),
    Mutation(
        "ship sends every file in the kernel's line cache, not only the notebook's cells",
        "distlab/_ranks/ship.py",
        "entry[1] is None and entry[2]",
        "entry[2]",
        ("tests/test_ship.py",),
    ),
    Mutation(
        "Adam's allowance for v forgets the squared difference of the gradients",
        "distlab/gradcheck/optimizers.py",
        "(2 * g.abs() * dg + dg * dg)",
        "(2 * g.abs() * dg)",
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "AMSGrad's allowance divides by v, not its running maximum",
        "distlab/gradcheck/optimizers.py",
        'v = state.get("max_exp_avg_sq") if amsgrad else state.get("exp_avg_sq")',
        'v = state.get("exp_avg_sq")',
        ("tests/test_gradcheck.py",),
    ),
    Mutation(
        "an ep that does not divide a mixture's experts is accepted",
        "distlab/calculators/memory_estimate.py",
        "        if experts % ep:",
        "        if False:",
        ("tests/test_calculators.py",),
    ),
]


def _run(m: Mutation) -> tuple[bool, float, str]:
    path = ROOT / m.file
    original = path.read_text()
    if original.count(m.old) != 1:
        return False, 0.0, f"the fragment is found {original.count(m.old)} times: fix the table"
    path.write_text(original.replace(m.old, m.new))
    try:
        start = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             "-o", "addopts=", *m.tests],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )
        took = time.monotonic() - start
        last = (out.stdout.strip().splitlines() or [""])[-1]
        return out.returncode != 0, took, last
    finally:
        path.write_text(original)


def main() -> None:
    chosen = {int(a) for a in sys.argv[1:]}
    rows = []
    for n, m in enumerate(MUTATIONS, start=1):
        if chosen and n not in chosen:
            continue
        caught, took, last = _run(m)
        rows.append((n, m, caught, took, last))
        print(f"{n:>2} {'caught  ' if caught else 'SURVIVED'} {took:6.0f} s  {m.what}  ({last})",
              flush=True)
    score = sum(caught for *_, caught, _, _ in rows)
    print(f"\n{score} of {len(rows)} mutations caught ({score / len(rows):.0%})")


if __name__ == "__main__":
    main()
