"""The report of `bench/convergence.py`: tables (Markdown), the raw numbers (JSON) and two plots
(PNG, matplotlib) from what the study's stages left in its work folder.

* Summary per run: held-out masked-LM loss and accuracy and next-sentence accuracy at the end
  (seq 128), the loss at 512 before and after phase 2, training wall seconds (evaluation
  excluded on both sides) and CPU seconds (the process's, evaluation included for the peer),
  and the time to reach each peer run's final held-out loss (wall seconds, interpolated
  linearly between evaluation points; "not reached" when the curve never gets there); the
  speed-up divides the peer's own time to that loss (its first arrival) by it.
* The unigram baseline (``pretraining.baseline``) as the line every curve must go below.
* Each run's curve at its evaluation points (sequences seen, wall seconds, learning rate,
  held-out metrics).
* Downstream: mean, standard deviation and range over seeds per model and task.
* The issue's acceptance checks, computed from the same numbers.
"""
import json
import os
import statistics

from convergence_downstream import TASKS, metric_name

PEERS = ("hf-adamw", "hf-lamb")
# "Clearly below the unigram baseline": by at least this many nats (a quarter of a nat is a
# perplexity 22% below the baseline's; a model that learned only frequencies sits within a
# few hundredths of it).
CLEARLY_BELOW = 0.25
COLORS = {"ours-lamb-all": "tab:blue", "ours-lamb-weights": "tab:cyan",
          "ours-adam": "tab:green", "ours-adamw": "tab:olive", "hf-adamw": "tab:red",
          "hf-lamb": "tab:orange"}


def load_curves(study, names):
    curves, done = {}, {}
    for name in names:
        folder = study.path("runs", name)
        curve = os.path.join(folder, "curve.jsonl")
        if os.path.exists(curve) and os.path.exists(os.path.join(folder, "done.json")):
            with open(curve, encoding="utf-8") as reader:
                curves[name] = [json.loads(line) for line in reader if line.strip()]
            with open(os.path.join(folder, "done.json"), encoding="utf-8") as reader:
                done[name] = json.load(reader)
    return curves, done


def time_to(curve, target, key="masked_lm_loss_128"):
    """Wall seconds at which `curve` first reaches `target` (linear between points)."""
    previous = None
    for row in curve:
        if row[key] <= target:
            if previous is None:
                return row["wall_seconds"]
            fraction = (previous[key] - target) / (previous[key] - row[key])
            return previous["wall_seconds"] + fraction * (row["wall_seconds"]
                                                          - previous["wall_seconds"])
        previous = row
    return None


def phase_end(curve, phase):
    rows = [row for row in curve if row["phase"] == phase]
    return rows[-1] if rows else None


def summary_rows(curves, done):
    peers = {peer: curves[peer][-1]["masked_lm_loss_128"] for peer in PEERS if peer in curves}
    rows = []
    for name, curve in curves.items():
        final, first_end = curve[-1], phase_end(curve, 1)
        timing = done[name]["timing"]
        row = {"run": name, "sequences": final["sequences"],
               "masked_lm_loss_128": final["masked_lm_loss_128"],
               "masked_lm_accuracy_128": final["masked_lm_accuracy_128"],
               "next_sentence_accuracy_128": final["next_sentence_accuracy_128"],
               "masked_lm_loss_512_phase1": first_end.get("masked_lm_loss_512"),
               "masked_lm_loss_512": final.get("masked_lm_loss_512"),
               # training time only: the peer's evaluation loop stops its clock, and ours
               # is evaluated afterwards from checkpoints (whose writing ours does pay)
               "wall_seconds": final["wall_seconds"],
               "cpu_seconds": sum(t["cpu_seconds"] for t in timing)}
        for peer, target in peers.items():
            reached = time_to(curve, target)
            row[f"seconds_to_{peer}"] = reached
            # the peer's own first arrival at its final loss (it may get there before its
            # last point): the fastest the peer itself delivers that model
            peer_time = time_to(curves[peer], target)
            row[f"speedup_vs_{peer}"] = peer_time / reached if reached else None
        rows.append(row)
    return rows


def _fmt(value, digits=3):
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(study, data, curves, done, summary, downstream, checks):
    recipe = study.recipe
    baseline = data["baseline"]
    cpu = next(iter(done.values()))["cpu"] if done else "unknown CPU"
    lines = [
        "# Pre-training from scratch: ours beside HuggingFace's",
        "",
        f"Written by `python bench/convergence.py` ({'quick' if recipe.model == 'tiny' else 'full'} "
        f"study). CPU: {cpu}, 2 cores, one run at a time. Model: BERT-{recipe.model} "
        f"(`modeling/configs/bert_{recipe.model}_config.json`) with a {data['vocab_size']}-token "
        f"WordPiece vocabulary; corpus `{data['dataset']}` through `bertPrep.py`; held-out: the "
        f"static test records (whole documents never trained on), first "
        f"{recipe.eval_examples_128} examples at 128 and {recipe.eval_examples_512} at 512.",
        "",
        "## Recipe",
        "",
        "| run | optimizer | records | phase 1: batch x steps (warm-up), peak LR | "
        "phase 2: batch x steps (warm-up), peak LR |",
        "|---|---|---|---|---|",
    ]
    for name, record in done.items():
        run = record["run"]
        plans = {plan["phase"]: plan for plan in record["phases"]}
        optimizer = run["optimizer"] + (f" ({run['adaptation']})" if run["adaptation"] else "")
        cells = [f"{p['batch_size']} x {p['steps']} ({p['warmup_steps']}), "
                 f"{p['learning_rate']:g}" for p in (plans[1], plans[2])]
        lines.append(f"| {name} | {optimizer} | {run['records']} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "## Summary (held-out masked-LM loss is the mean over masked tokens)",
        "",
        f"Unigram baseline (always the training records' token frequencies): loss "
        f"{baseline['128']['masked_lm_loss']:.3f}, accuracy "
        f"{baseline['128']['masked_lm_accuracy']:.3f} at 128; loss "
        f"{baseline['512']['masked_lm_loss']:.3f} at 512. Next sentence: majority "
        f"{baseline['128']['next_sentence_accuracy']:.3f}.",
        "",
        "| run | sequences | MLM loss 128 | MLM acc 128 | NSP acc | MLM loss 512 after "
        "phase 1 -> 2 | wall s | CPU s | s to hf-adamw's final loss | speed-up vs hf-adamw "
        "| s to hf-lamb's final | speed-up vs hf-lamb |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary:
        speed = {peer: (f"{row[f'speedup_vs_{peer}']:.2f}x"
                        if row.get(f"speedup_vs_{peer}") else "not reached")
                 for peer in PEERS if f"speedup_vs_{peer}" in row}
        lines.append(
            f"| {row['run']} | {row['sequences']:,.0f} | {row['masked_lm_loss_128']:.3f} | "
            f"{row['masked_lm_accuracy_128']:.3f} | {row['next_sentence_accuracy_128']:.3f} | "
            f"{_fmt(row['masked_lm_loss_512_phase1'])} -> {_fmt(row['masked_lm_loss_512'])} | "
            f"{row['wall_seconds']:,.0f} | {row['cpu_seconds']:,.0f} | "
            f"{_fmt(row.get('seconds_to_hf-adamw'), 0)} | {speed.get('hf-adamw', '–')} | "
            f"{_fmt(row.get('seconds_to_hf-lamb'), 0)} | {speed.get('hf-lamb', '–')} |")
    sweep = study.load("sweep.json", {})
    if sweep:
        lines += ["", f"Peak learning rates: the best of a sweep of short phase-1 runs of ours "
                  f"(`--stages sweep`: {next(iter(sweep.values()))['steps']} steps each, their "
                  f"own schedule), held-out loss at 128:", "",
                  "| optimizer | learning rate: held-out loss |" + " |" * 2]
        by_key = {}
        for row in sweep.values():
            by_key.setdefault(row["optimizer"], []).append(row)
        lines.append("|---|" + "---:|" * max(len(rows) for rows in by_key.values()))
        for key, rows in by_key.items():
            rows.sort(key=lambda row: row["learning_rate"])
            lines.append(f"| {key} | " + " | ".join(
                f"{row['learning_rate']:g}: {row['masked_lm_loss_128']:.3f}" for row in rows)
                + " |")
    lines += ["", "## Acceptance checks", ""]
    lines += [f"- {'PASS' if ok else 'FAIL'}: {text}" for ok, text in checks]
    if downstream:
        lines += ["", "## Downstream (fine-tuned with one recipe: "
                  "`bench/convergence_downstream.py` FINETUNE)", "",
                  "| model | " + " | ".join(f"{task} {metric_name(task)}: mean ± sd (min..max)"
                                           for task in TASKS) + " |",
                  "|---|" + "---:|" * len(TASKS)]
        for model, tasks in downstream.items():
            cells = []
            for task in TASKS:
                values = list(tasks.get(task, {}).values())
                cells.append(_spread(values) if values else "–")
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += ["", "## Curves", ""]
    for name, curve in curves.items():
        lines += [f"### {name}", "",
                  "| phase | step | sequences | wall s | learning rate | MLM loss 128 | "
                  "MLM acc 128 | NSP acc 128 | MLM loss 512 |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for row in curve:
            lines.append(
                f"| {row['phase']} | {row['step']} | {row['sequences']:,.0f} | "
                f"{_fmt(row.get('wall_seconds'), 0)} | {row.get('learning_rate', 0):.3g} | "
                f"{row['masked_lm_loss_128']:.4f} | {row['masked_lm_accuracy_128']:.4f} | "
                f"{row['next_sentence_accuracy_128']:.3f} | "
                f"{_fmt(row.get('masked_lm_loss_512'), 4)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _spread(values):
    mean = statistics.mean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {sd:.3f} ({min(values):.3f}..{max(values):.3f})"


def acceptance(data, curves, summary, downstream):
    """(passed, sentence) for each of the issue's measurable criteria."""
    checks = []
    by_run = {row["run"]: row for row in summary}
    for ours in ("ours-adamw", "ours-adam"):  # the same equations as the peer's first
        if ours in curves:
            break
    if ours in curves and "hf-adamw" in curves:
        pairs = [(a, b) for a, b in zip(curves[ours], curves["hf-adamw"])
                 if a["sequences"] == b["sequences"]]
        worst = max(abs(a["masked_lm_loss_128"] / b["masked_lm_loss_128"] - 1) for a, b in pairs)
        final = curves[ours][-1]["masked_lm_loss_128"] / \
            curves["hf-adamw"][-1]["masked_lm_loss_128"] - 1
        checks.append((abs(final) <= 0.02,
                       f"{ours} vs hf-adamw at equal sequences: final held-out loss "
                       f"{final:+.2%} (largest difference over the {len(pairs)} points "
                       f"{worst:.2%}; goal within 2%)"))
    ours = [row for row in summary if row["run"].startswith("ours-")]
    if ours and "hf-adamw" in by_run:
        best = max(ours, key=lambda row: row.get("speedup_vs_hf-adamw") or 0)
        speed = best.get("speedup_vs_hf-adamw")
        checks.append((bool(speed) and speed >= 1.3,
                       f"time to hf-adamw's final held-out loss: {best['run']} "
                       f"{speed or 0:.2f}x faster in wall seconds (goal >= 1.3x)"))
    line = data["baseline"]["128"]["masked_lm_loss"]
    for row in summary:
        checks.append((row["masked_lm_loss_128"] < line - CLEARLY_BELOW,
                       f"{row['run']}: held-out loss {row['masked_lm_loss_128']:.3f} below the "
                       f"unigram baseline {line:.3f} by {line - row['masked_lm_loss_128']:.3f}"))
        before, after = row["masked_lm_loss_512_phase1"], row["masked_lm_loss_512"]
        if before is not None and after is not None:
            checks.append((after < before, f"{row['run']}: phase 2 lowers the held-out loss at "
                                           f"512 from {before:.3f} to {after:.3f}"))
    if downstream and "random init" in downstream:
        random_init = downstream["random init"]
        for task in TASKS:
            base = list(random_init.get(task, {}).values())
            if not base:
                continue
            for model, tasks in downstream.items():
                values = list(tasks.get(task, {}).values())
                if model == "random init" or not values:
                    continue
                spread = max(max(values) - min(values), max(base) - min(base))
                gain = statistics.mean(values) - statistics.mean(base)
                checks.append((gain > spread,
                               f"{model} on {task}: {gain:+.3f} {metric_name(task)} over random "
                               f"init (seed spread {spread:.3f})"))
        for task in TASKS:
            peer = [v for m, t in downstream.items() if m.startswith("hf-")
                    for v in [statistics.mean(t[task].values())] if t.get(task)]
            ours_best = [statistics.mean(t[task].values()) for m, t in downstream.items()
                         if m.startswith("ours-") and t.get(task)]
            if peer and ours_best:
                checks.append((max(ours_best) >= max(peer) - 1e-9,
                               f"{task}: best of ours {max(ours_best):.3f} vs best peer "
                               f"{max(peer):.3f} (ours no worse)"))
    return checks


def plots(study, data, curves, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    line = data["baseline"]["128"]["masked_lm_loss"]
    written = []
    for axis, label, name in (("sequences", "sequences seen", "sequences"),
                              ("wall_seconds", "wall-clock seconds (2 CPU cores)", "seconds")):
        figure, ax = plt.subplots(figsize=(8, 5))
        for run, curve in curves.items():
            points = [row for row in curve if axis in row]
            ax.plot([row[axis] for row in points], [row["masked_lm_loss_128"] for row in points],
                    marker="o", markersize=3, label=run, color=COLORS.get(run))
        ax.axhline(line, linestyle="--", color="gray", label="unigram baseline")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out masked-LM loss (seq 128)")
        ax.set_title(f"BERT-{study.recipe.model} pre-training from scratch: ours vs HuggingFace")
        ax.grid(alpha=0.3)
        ax.legend()
        path = os.path.join(out_dir, f"convergence_loss_vs_{name}.png")
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


def write_report(study, data, names):
    curves, done = load_curves(study, names)
    if not curves:
        raise SystemExit("convergence: no finished and evaluated run to report")
    summary = summary_rows(curves, done)
    downstream = study.load("downstream.json", {})
    checks = acceptance(data, curves, summary, downstream)
    os.makedirs(study.results, exist_ok=True)
    md = os.path.join(study.results, "convergence.md")
    with open(md, "w", encoding="utf-8") as writer:
        writer.write(markdown(study, data, curves, done, summary, downstream, checks))
    raw = os.path.join(study.results, "convergence.json")
    with open(raw, "w", encoding="utf-8") as writer:
        json.dump({"baseline": data["baseline"], "summary": summary, "curves": curves,
                   "downstream": downstream, "runs": done,
                   "checks": [{"passed": ok, "check": text} for ok, text in checks]},
                  writer, indent=1)
    for ok, text in checks:
        print(f"   {'PASS' if ok else 'FAIL'}: {text}", flush=True)
    return [md, raw] + plots(study, data, curves, study.results)
