"""PNG figures from a results document: speedup per category and method, relative
TTFT, the per-round time profile and the distribution of the number of draft
sequences. matplotlib's Agg backend: no display needed (CI, servers)."""
from __future__ import annotations

from pathlib import Path

from hetspec.benchmarks.bench.data import TITLES
from hetspec.benchmarks.bench.tables import profile_rows, sequence_rows


def write_plots(doc: dict, out_dir: str | Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    written = []
    for name, draw in (("speedup", _speedup), ("ttft", _ttft), ("round_profile", _profile),
                       ("sequences", _sequences)):
        fig = draw(plt, doc)
        if fig is None:
            continue
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(str(path))
    return written


def _speedup(plt, doc: dict):
    decodings = doc["settings"]["decodings"]
    cats = [*doc["settings"]["categories"], "average"]
    methods = [m for m in doc["methods"] if m != "vanilla"]
    if not methods:
        return None
    width_in = max(8.0, min(18.0, 0.16 * len(cats) * len(methods) + 2))
    fig, axes = plt.subplots(len(decodings), 1, figsize=(width_in, 3.6 * len(decodings)), squeeze=False)
    colors = plt.get_cmap("tab20").colors
    width = 0.8 / len(methods)
    for ax, decoding in zip(axes[:, 0], decodings):
        res = doc["results"][decoding]
        for i, method in enumerate(methods):
            values = [res.get(method, {}).get(c, {}).get("speedup") or 0 for c in cats]
            ax.bar([x + (i - (len(methods) - 1) / 2) * width for x in range(len(cats))], values, width, label=method,
                   color=colors[i % len(colors)])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(cats)), [TITLES.get(c, "Avg.") for c in cats])
        ax.set_ylabel("speedup over vanilla")
        ax.set_title(f"Speedup per category ({decoding})")
    axes[0, 0].legend(ncol=4, fontsize=7)
    return fig


def _ttft(plt, doc: dict):
    decodings = doc["settings"]["decodings"]
    methods = list(doc["methods"])
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(methods)), 3.6))
    width = 0.8 / len(decodings)
    for i, decoding in enumerate(decodings):
        res = doc["results"][decoding]
        values = [res.get(m, {}).get("average", {}).get("ttft_rel") or 0 for m in methods]
        ax.bar([x + (i - (len(decodings) - 1) / 2) * width for x in range(len(methods))], values, width, label=decoding)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(methods)), methods, rotation=45, ha="right")
    ax.set_ylabel("TTFT relative to vanilla")
    ax.set_title("Time to first token (average over categories)")
    ax.legend()
    return fig


def _profile(plt, doc: dict):
    bars = [(f"{method}\n{decoding}", p) for decoding, method, p in profile_rows(doc)]
    if not bars:
        return None
    _, ax = plt.subplots(figsize=(max(6, 0.8 * len(bars)), 4))
    xs = range(len(bars))
    for offset, key, color in ((-0.3, "draft", "tab:orange"), (-0.1, "verify", "tab:blue"),
                               (0.1, "overhead", "tab:red"), (0.3, "round", "tab:gray")):
        ax.bar([x + offset for x in xs], [p[key] for _, p in bars], 0.2, label=key, color=color)
    return _finish(ax, [label for label, _ in bars], "ms per speculative round", "Per-round time profile")


def _sequences(plt, doc: dict):
    rows = [(f"{method}\n{decoding}", hist) for decoding, method, hist in sequence_rows(doc)]
    if not rows:
        return None
    ks = sorted({k for _, h in rows for k in h}, key=int)
    _, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 4))
    bottom = [0.0] * len(rows)
    for k in ks:
        shares = [h.get(k, 0) / sum(h.values()) for _, h in rows]
        ax.bar(range(len(rows)), shares, 0.6, bottom=bottom, label=f"k={k}")
        bottom = [b + s for b, s in zip(bottom, shares)]
    return _finish(ax, [label for label, _ in rows], "share of speculative rounds", "Number of draft sequences per round")


def _finish(ax, labels: list[str], ylabel: str, title: str):
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    return ax.figure
