"""PNG figures from a results document: speedup per category and method, relative TTFT, the
per-round time profile and the number of draft sequences (matplotlib's Agg: no display needed)."""
from __future__ import annotations

from pathlib import Path

from hetspec.benchmarks.bench.data import TITLES
from hetspec.benchmarks.bench.tables import profile_rows, sequence_rows


def write_plots(doc: dict, out_dir: str | Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, draw in (("speedup", _speedup), ("ttft", _ttft), ("round_profile", _profile), ("sequences", _sequences)):
        fig = draw(plt, doc)
        if fig is not None:
            written.append(str(Path(out_dir) / f"{name}.png"))
            fig.savefig(written[-1], dpi=110, bbox_inches="tight")
            plt.close(fig)
    return written


def _bars(ax, labels: list[str], series: dict[str, list[float]], ylabel: str, title: str, width: float = 0.8):
    """Grouped bars: a bar of each series at each label (tab20: up to 20 series in colours of their own)."""
    from matplotlib import colormaps

    for i, (name, values) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width / len(series)
        ax.bar([x + offset for x in range(len(labels))], values, width / len(series), label=name,
               color=colormaps["tab20"].colors[i % 20])
    ax.set_xticks(range(len(labels)), labels, rotation=45 if len(labels) > 8 else 0, ha="right", fontsize=7)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(ncol=4, fontsize=7)


def _speedup(plt, doc: dict):
    decodings, cats = doc["settings"]["decodings"], [*doc["settings"]["categories"], "average"]
    methods = [m for m in doc["methods"] if m != "vanilla"]
    if not methods:
        return None
    width = max(8.0, min(18.0, 0.16 * len(cats) * len(methods) + 2))
    fig, axes = plt.subplots(len(decodings), 1, squeeze=False, figsize=(width, 3.6 * len(decodings)))
    for ax, decoding in zip(axes[:, 0], decodings):
        res = doc["results"][decoding]
        _bars(ax, [TITLES.get(c, "Avg.") for c in cats],
              {m: [res.get(m, {}).get(c, {}).get("speedup") or 0 for c in cats] for m in methods},
              "speedup over vanilla", f"Speedup per category ({decoding})")
        ax.axhline(1.0, color="black", linewidth=0.8)
    return fig


def _ttft(plt, doc: dict):
    methods = list(doc["methods"])
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(methods)), 3.6))
    _bars(ax, methods, {d: [doc["results"][d].get(m, {}).get("average", {}).get("ttft_rel") or 0 for m in methods]
                        for d in doc["settings"]["decodings"]},
          "TTFT relative to vanilla", "Time to first token (average over categories)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    return fig


def _profile(plt, doc: dict):
    rows = profile_rows(doc)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 4))
    _bars(ax, [f"{method}\n{decoding}" for decoding, method, _ in rows],
          {key: [p[key] for _, _, p in rows] for key in ("draft", "verify", "overhead", "round")},
          "ms per speculative round", "Per-round time profile")
    return fig


def _sequences(plt, doc: dict):
    """Stacked: each round's share of k draft sequences, a bar per (decoding, method)."""
    hists = [(f"{method}\n{decoding}", hist) for decoding, method, hist in sequence_rows(doc)]
    if not hists:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(hists)), 4))
    bottom = [0.0] * len(hists)
    for k in sorted({k for _, h in hists for k in h}, key=int):
        shares = [h.get(k, 0) / sum(h.values()) for _, h in hists]
        ax.bar(range(len(hists)), shares, 0.6, bottom=bottom, label=f"k={k}")
        bottom = [b + s for b, s in zip(bottom, shares)]
    ax.set_xticks(range(len(hists)), [label for label, _ in hists], rotation=45, ha="right", fontsize=7)
    ax.set(ylabel="share of speculative rounds", title="Number of draft sequences per round")
    ax.legend()
    return fig
