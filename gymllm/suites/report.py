"""``report.md`` and the PNG plots of a suite run, from its ``summary.json`` data.

* ``report.md``: mean reward [95% interval] and pass@1 / pass@k of every policy on every env and on
  the whole suite ("*"), the best policy per env in bold with its interval, then the paired
  comparisons (diff, interval, p-value) and the run's notes;
* ``rewards.png``: per-env bars of mean reward with their intervals, one bar per policy;
* ``pass_at_k.png``: pass@j against j, one panel per env, one curve per policy.

Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import pathlib
from typing import Any

__all__ = ["report_markdown", "comparison_table", "write_report", "plot_rewards", "plot_pass_at_k"]


def _entries(summary: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["policy"], r["env"]): r for r in summary["results"]}


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    lo, hi = r["mean_reward_ci"]
    k = str(r["k"])
    pk = r["pass_at"].get(k)
    text = f"{r['mean_reward']:.3f} [{lo:.3f}, {hi:.3f}]; pass@1 {r['pass_at'].get('1', float('nan')):.3f}"
    text += f", pass@{k} {pk:.3f}" if pk is not None and k != "1" else ""
    return text + (f"; {r['errors']} errors" if r["errors"] else "")


def comparison_table(summary: dict[str, Any]) -> str:
    """The paired comparisons as a markdown table (``gymllm compare`` prints it)."""
    lines = [
        "| a | b | env | metric | diff (a - b) | 95% interval | p-value | pairs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["comparisons"]:
        lo, hi = c["ci"]
        lines.append(
            f"| {c['a']} | {c['b']} | {c['env']} | {c['metric']} | {c['diff']:+.3f} | [{lo:+.3f}, {hi:+.3f}] "
            f"| {c['p_value']:.3g} | {c.get('pairs', '')} |"
        )
    return "\n".join(lines)


def report_markdown(summary: dict[str, Any]) -> str:
    entries = _entries(summary)
    policies, envs = summary["policies"], [*summary["envs"], "*"]
    out = [
        f"# Suite `{summary['suite']}`",
        "",
        "Each cell: mean reward [95% bootstrap interval over seeds]; pass@1, pass@k (unbiased estimator). "
        "`*` is the whole suite with its weights. **Bold**: the best mean reward of the env.",
        "",
        "| env | " + " | ".join(policies) + " |",
        "|---" * (len(policies) + 1) + "|",
    ]
    best_lines = []
    for env in envs:
        cells = [entries.get((p, env)) for p in policies]
        scored = [(c["mean_reward"], p) for c, p in zip(cells, policies) if c is not None]
        best = max(scored)[1] if scored else None
        row = [
            f"**{_cell(c)}**" if p == best and len(scored) > 1 else _cell(c)
            for c, p in zip(cells, policies)
        ]
        out.append(f"| {env} | " + " | ".join(row) + " |")
        if best is not None:
            b = entries[(best, env)]
            best_lines.append(
                f"- {env}: **{best}**, mean reward {b['mean_reward']:.3f} "
                f"[{b['mean_reward_ci'][0]:.3f}, {b['mean_reward_ci'][1]:.3f}]"
            )
    out += ["", "## Best per env", "", *best_lines]
    if summary["comparisons"]:
        out += [
            "",
            "## Paired comparisons",
            "",
            "Differences a - b over the same (env, seed, sample); intervals and p-values by a paired bootstrap "
            "over seeds.",
            "",
            comparison_table(summary),
        ]
    if summary.get("notes"):
        out += ["", "## Notes", "", *[f"- {n}" for n in summary["notes"]]]
    out += ["", "![mean reward per env](rewards.png)", "", "![pass@k](pass_at_k.png)", ""]
    return "\n".join(out)


def plot_rewards(summary: dict[str, Any], path: str | pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    entries = _entries(summary)
    policies, envs = summary["policies"], [*summary["envs"], "*"]
    width = 0.8 / max(1, len(policies))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(envs) * max(1, len(policies)) ** 0.5), 4.0))
    x = np.arange(len(envs))
    for i, p in enumerate(policies):
        vals = [entries.get((p, e)) for e in envs]
        mean = np.array([v["mean_reward"] if v else np.nan for v in vals])
        lo = np.array([v["mean_reward_ci"][0] if v else np.nan for v in vals])
        hi = np.array([v["mean_reward_ci"][1] if v else np.nan for v in vals])
        ax.bar(
            x + (i - (len(policies) - 1) / 2) * width,
            mean,
            width,
            yerr=np.nan_to_num(np.vstack([mean - lo, hi - mean])),
            capsize=3,
            label=p,
        )
    ax.set_xticks(x, envs, rotation=30, ha="right")
    ax.set_ylabel("mean reward (95% interval)")
    ax.set_title(f"suite {summary['suite']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_pass_at_k(summary: dict[str, Any], path: str | pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = _entries(summary)
    envs = [*summary["envs"], "*"]
    cols = min(4, len(envs))
    rows = (len(envs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    for ax, env in zip(axes.flat, envs):
        for p in summary["policies"]:
            r = entries.get((p, env))
            if r and r["pass_at"]:
                js = sorted(int(j) for j in r["pass_at"])
                ax.plot(js, [r["pass_at"][str(j)] for j in js], marker="o", label=p)
        ax.set_title(env, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("k")
    for ax in list(axes.flat)[len(envs) :]:
        ax.axis("off")
    axes.flat[0].set_ylabel("pass@k")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(out: str | pathlib.Path, summary: dict[str, Any]) -> list[pathlib.Path]:
    """Write ``report.md``, ``rewards.png`` and ``pass_at_k.png`` into ``out``; returns their paths."""
    out = pathlib.Path(out)
    md = out / "report.md"
    md.write_text(report_markdown(summary), encoding="utf-8")
    return [
        md,
        plot_rewards(summary, out / "rewards.png"),
        plot_pass_at_k(summary, out / "pass_at_k.png"),
    ]
