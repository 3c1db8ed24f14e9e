"""The sink-dynamics figures (paper Figs. 3, 5, 7, 10, sink stability, and the sinks' value
norms), drawn from a saved trace alone.

Every figure's title names the model and the steps it covers; scores are Eq. 3 scores in units
of the uniform attention share (docs/method.md section 2: 1 = the attention a key would get if every query spread
its attention evenly).
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np

from .sink_trace import LOW_VALUE_NORM, Trace, evenly_spaced_steps, parse_heads
from .text_format import or_na

FIGURES = {
    "fig3": "fig3_score_distribution.png",
    "fig5": "fig5_main_sink_heatmap.png",
    "fig7": "fig7_sink_position.png",
    "fig10": "fig10_eps_selection.png",
    "stability": "sink_stability.png",
    "value_norms": "fig_value_norms.png",  # traces of version 3 and later
}


# a per-(layer, head) heatmap writes its numbers into the cells up to this many cells; beyond,
# they overlap into noise
NUMBERED_CELLS = 256


def _numbered_cells(L: int, H: int):
    """Every (layer, head) of an L x H map small enough to write its numbers in, else none."""
    return itertools.product(range(L), range(H)) if L * H <= NUMBERED_CELLS else ()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _name(trace: Trace) -> str:
    m = trace.meta
    unit = "step" if m["kind"] == "dlm" else "token"
    masked = f", top-{m['top_k']} sinks masked" if m.get("top_k") else ""
    return f"{m['name']} ({m['kind'].upper()}, {m['steps']} {unit}s{masked})"


def _step_word(trace: Trace) -> str:
    return "denoising step" if trace.meta["kind"] == "dlm" else "generation step (forward pass)"


def _bin_labels(edges: np.ndarray) -> list[str]:
    def f(x):
        return f"{x:g}" if x >= 1 else f"1/{round(1 / x)}"

    labels = [f"<{f(edges[1])}"]
    labels += [f"{f(lo)}-{f(hi)}" for lo, hi in zip(edges[1:-2], edges[2:-1])]
    labels.append(f">={f(edges[-2])}")
    return labels


def _layer_head_axes(ax, L: int, H: int) -> None:
    """Heads across, layers down, every one ticked: the axes of each per-(layer, head) map."""
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")


def fig_score_distribution(trace: Trace, path: Path) -> Path:
    """Fig. 3: most keys get a score near 0, a few (the sinks) many times the uniform share."""
    plt = _plt()
    hist = trace["hist"].sum(axis=(1, 2)).astype(float)  # [T, bins] over layers and heads
    frac = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
    labels = _bin_labels(trace["hist_edges"])
    used = np.flatnonzero(frac.sum(axis=0) > 0)
    lo, hi = used.min(), used.max() + 1
    T = trace.steps
    picks = evenly_spaced_steps(T, 4)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1, 1.25]})
    x = np.arange(lo, hi)
    width = 0.8 / len(picks)
    for i, t in enumerate(picks):
        a.bar(x + (i - (len(picks) - 1) / 2) * width, frac[t - 1, lo:hi], width, label=f"step {t}")
    a.set_yscale("log")
    a.set_xticks(x, labels[lo:hi], rotation=45, ha="right", fontsize=8)
    a.set_xlabel("Eq. 3 score (x uniform share)")
    a.set_ylabel("share of (key, layer, head)")
    a.legend(fontsize=8)
    a.set_title("score histogram at four steps")
    with np.errstate(divide="ignore"):
        img = np.log10(frac[:, lo:hi].T)
    im = b.imshow(np.where(np.isfinite(img), img, np.nan), aspect="auto", origin="lower",
                  cmap="magma", extent=(0.5, T + 0.5, lo - 0.5, hi - 0.5), interpolation="nearest")
    b.set_yticks(x, labels[lo:hi], fontsize=8)
    b.set_xlabel(_step_word(trace))
    b.set_ylabel("Eq. 3 score (x uniform share)")
    b.set_title("all steps")
    fig.colorbar(im, ax=b, label="log10 share of (key, layer, head); white: none")
    fig.suptitle(f"Distribution of cumulative attention scores: {_name(trace)}, steps 1-{T}")
    fig.tight_layout()
    return _save(fig, path)


def fig_main_sink_heatmap(trace: Trace, path: Path) -> Path:
    """Fig. 5: the main (top-1) sink's score per (layer, head), averaged over steps."""
    plt = _plt()
    top1 = trace["top_score"][..., 0]  # [T, L, H]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # layers the intercept did not score
        mean = np.nanmean(top1, axis=0)
    share = trace.top_is_sink()[np.isfinite(trace["total"])]  # scored (step, layer, head)
    L, H = mean.shape
    fig, ax = plt.subplots(figsize=(max(7.5, 0.45 * H + 3), max(4.0, 0.4 * L + 2.2)))
    im = ax.imshow(mean, aspect="auto", cmap="viridis", origin="upper", interpolation="nearest")
    for l, h in _numbered_cells(L, H):
        ax.text(h, l, f"{mean[l, h]:.3g}", ha="center", va="center", fontsize=7,
                color="white" if im.norm(mean[l, h]) < 0.6 else "black")
    _layer_head_axes(ax, L, H)
    fig.colorbar(im, ax=ax, label="main sink score (x uniform share)")
    ax.set_title(
        f"Main sink's score per layer and head, mean over steps 1-{trace.steps}\n{_name(trace)}; "
        f"top key is an Eq. 3 sink at eps={trace.meta['eps']:g} in {share.mean():.0%} of "
        "(step, layer, head)",
        fontsize=9,
    )
    fig.tight_layout()
    return _save(fig, path)


def default_heads(trace: Trace, n: int = 4) -> list[tuple[int, int]]:
    """Heads whose top key is most often a sink, ties broken by how often it moves."""
    is_sink = trace.top_is_sink()  # [T, L, H]
    pos = trace["top_pos"][..., 0]
    L, H = is_sink.shape[1:]
    ranked = []
    for l in range(L):
        for h in range(H):
            p = pos[is_sink[:, l, h], l, h]
            moves = int((np.diff(p) != 0).sum()) if len(p) > 1 else 0
            ranked.append((-int(is_sink[:, l, h].sum()), -moves, l, h))
    return [(l, h) for _, _, l, h in sorted(ranked)[:n]]


def fig_sink_position(trace: Trace, path: Path, heads: list[tuple[int, int]] | None = None) -> Path:
    """Fig. 7: the largest sink's position at each step, for a few heads (gaps: no sink)."""
    plt = _plt()
    heads = heads or default_heads(trace)
    T = trace.steps
    steps = np.arange(1, T + 1)
    is_sink = trace.top_is_sink()
    pos = trace["top_pos"][..., 0].astype(float)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    drawn = False  # any sink in these heads
    for l, h in heads:
        if l >= pos.shape[1] or h >= pos.shape[2]:
            raise ValueError(f"head {l}:{h} is outside the trace's {pos.shape[1]} layers x {pos.shape[2]} heads")
        y = np.where(is_sink[:, l, h], pos[:, l, h], np.nan)
        drawn |= bool(np.isfinite(y).any())
        ax.plot(steps, y, marker="o", markersize=3.5, linewidth=1.3, label=f"layer {l}, head {h}")
    P = trace.meta["prompt_length"] + trace.key_offset  # in key positions, like top_pos
    ax.axhline(P - 0.5, color="grey", linestyle=":", linewidth=1)
    # labelled in the right margin, where no data line can run over it
    for word, va in (("\u2191 prompt", "bottom"), ("\u2193 generation", "top")):
        ax.text(1.01, P - 0.5, word, transform=ax.get_yaxis_transform(), va=va, ha="left",
                fontsize=8, color="grey", clip_on=False, gid="prompt-boundary")
    if "inputs" in trace.arrays and trace.meta.get("mask_id") is not None:
        # the unmasking frontier: rightmost position still masked at each step
        masked = trace["inputs"] == trace.meta["mask_id"]
        right = np.array([np.flatnonzero(r).max() if r.any() else np.nan for r in masked])
        left = np.array([np.flatnonzero(r).min() if r.any() else np.nan for r in masked])
        ax.fill_between(steps[: len(right)], left, right, color="tab:grey", alpha=0.12,
                        label="still-masked span")
    tokens = trace.meta.get("tokens") or []
    # every key position: the text's, plus an extra sink token before it (key_offset) or after it
    S = max(len(tokens) + trace.key_offset, int(trace["n_keys"].max()))
    ax.set_ylim(S - 0.5, -0.5)  # whole sequence, position 0 at the top
    if not drawn:
        ax.text(0.5, 0.5, f"no Eq. 3 sink at eps={trace.meta['eps']:g} in these heads",
                transform=ax.transAxes, ha="center", color="tab:red")
    ax.set_xlabel(_step_word(trace))
    ax.set_ylabel("position of the largest sink ("
                  + (f"key index = token index + {trace.key_offset})" if trace.key_offset else "token index)"))
    ax.set_xlim(0.5, T + 0.5)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    ax.set_title(f"Largest sink's position across steps: {_name(trace)}, steps 1-{T} "
                 f"(eps={trace.meta['eps']:g})", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def selected_share(scores: np.ndarray, eps_grid: np.ndarray) -> np.ndarray:
    """Share of keys that pass Eq. 3 at each eps: [..., Sk] scores (NaN = no key) -> [E, ...];
    NaN where a vector has no key at all (a layer the intercept did not score, e.g. layers=)."""
    s = scores.astype(np.float64)
    valid = np.isfinite(s)
    n = valid.sum(-1, keepdims=True)
    s0 = np.where(valid, s, 0.0)
    others = (s0.sum(-1, keepdims=True) - s0) / np.maximum(n - 1, 1)
    margin = np.where(valid & (n > 1), s0 - others, -np.inf)  # a key passes iff margin > eps
    scored = np.where(n[..., 0] > 0, 1.0, np.nan)
    return np.stack([scored * (margin > e).sum(-1) / np.maximum(n[..., 0], 1) for e in eps_grid])


def fig_eps_selection(trace: Trace, path: Path, eps_max: float = 10.0) -> Path:
    """Fig. 10: share of tokens that Eq. 3 selects as the threshold eps grows."""
    plt = _plt()
    eps_grid = np.linspace(0, eps_max, 81)
    share = selected_share(trace["full_scores"], eps_grid)  # [E, F, L, H]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    L = share.shape[2]
    cmap = plt.get_cmap("viridis")
    for l in range(L):
        if np.isnan(share[:, :, l]).all():
            continue  # not scored (layers=)
        ax.plot(eps_grid, 100 * np.nanmean(share[:, :, l], axis=(1, 2)), color=cmap(l / max(L - 1, 1)),
                linewidth=0.8, alpha=0.7, label=f"layer {l}" if L <= 8 else None)
    ax.plot(eps_grid, 100 * np.nanmean(share, axis=(1, 2, 3)), color="black", linewidth=2.4, label="all layers")
    e = trace.meta["eps"]
    at = 100 * np.nanmean(selected_share(trace["full_scores"], np.array([e])))
    ax.set_ylim(bottom=0)
    ax.axvline(e, color="tab:red", linestyle="--", linewidth=1)
    ax.text(e, ax.get_ylim()[1] * 0.9, f" eps={e:g}: {at:.1f}% selected", color="tab:red", fontsize=9)
    ax.set_xlabel("eps (Eq. 3 threshold, x uniform share)")
    ax.set_ylabel("tokens selected as sinks (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    steps = ", ".join(map(str, trace["full_steps"].tolist()))
    n_keys = sorted({int(trace["n_keys"][t - 1]) for t in trace["full_steps"]})
    ax.set_title(f"Share of tokens selected vs eps: {_name(trace)}\nsteps {steps}; "
                 f"{'/'.join(map(str, n_keys))} keys; mean over layers and heads", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def fig_stability(trace: Trace, path: Path) -> Path:
    """Issue 7: per (layer, head), how often the main sink keeps its position between steps, and
    the share of attention it receives (a moving sink is what the sink-token paper blames)."""
    plt = _plt()
    block = trace.stability()
    per = {k: np.array(v, dtype=float) for k, v in block["per_head"].items()}  # None -> NaN
    keep, share, distinct = per["keep_rate"], per["main_share"], per["distinct_positions"]
    scored = trace.scored_heads()
    L, H = keep.shape
    fig, axes = plt.subplots(1, 2, figsize=(max(11.0, 0.9 * H + 5), max(4.0, 0.4 * L + 2.4)))
    panels = [
        (axes[0], keep, "keep rate (same position at t and t+1)", dict(vmin=0, vmax=1, cmap="RdYlGn")),
        (axes[1], share, "main sink's share of attention (mean over its steps)",
         dict(vmin=0, vmax=max(float(np.nanmax(share)) if np.isfinite(share).any() else 1.0, 1e-3),
              cmap="viridis")),
    ]
    for ax, img, label, kw in panels:
        cmap = plt.get_cmap(kw.pop("cmap")).with_extremes(bad="lightgrey")
        im = ax.imshow(np.ma.masked_invalid(img), aspect="auto", origin="upper", interpolation="nearest",
                       cmap=cmap, **kw)
        for l, h in _numbered_cells(L, H):
            if not scored[l, h]:
                text = "not\nscored"
            elif not np.isfinite(img[l, h]):
                text = "-"
            else:
                text = f"{img[l, h]:.2f}"
            if img is keep and distinct[l, h] > 0:
                text += f"\n{int(distinct[l, h])} pos"
            ax.text(h, l, text, ha="center", va="center", fontsize=6.5)
        _layer_head_axes(ax, L, H)
        fig.colorbar(im, ax=ax, label=label)
    g = block["aggregate"]
    axes[0].set_title(f"keep rate, mean {or_na(g['keep_rate'])} over {g['heads_with_pairs']}/{g['heads']} heads; "
                      f"\"n pos\": distinct positions\n(grey: no sink at two consecutive steps)", fontsize=8)
    axes[1].set_title(f"main sink share, mean {or_na(g['main_share'], '.3f')} over {g['heads_with_sink']} heads"
                      "\n(grey: never a sink)", fontsize=8)
    fig.suptitle(f"Sink stability over steps 1-{trace.steps}: {_name(trace)}, eps={block['eps']:g}",
                 fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def fig_value_norms(trace: Trace, path: Path) -> Path:
    """Are sinks keys with small values? The value norm of each recorded top key relative to its
    head's median, for Eq. 3 sinks against top keys that are not sinks, and per (layer, head)
    for the main sink."""
    plt = _plt()
    rel = trace["top_vnorm"].astype(np.float64)  # [T, L, H, n]
    is_sink = trace.top_are_sinks()
    ok = np.isfinite(rel) & (rel > 0)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.2, 1]})
    finite = rel[ok]
    lo, hi = (np.log2(finite.min()), np.log2(finite.max())) if finite.size else (-3.0, 3.0)
    bins = 2.0 ** np.linspace(min(lo, -3), max(hi, 3), 41)
    for sel, label, color in ((is_sink, "Eq. 3 sinks", "tab:red"), (~is_sink, "other top keys", "tab:blue")):
        v = rel[sel & ok]
        if v.size:
            a.hist(v, bins=bins, alpha=0.55, color=color, density=True,
                   label=f"{label}: median {np.median(v):.2f} (n={v.size})")
    a.set_xscale("log", base=2)
    a.axvline(1.0, color="black", linestyle=":", linewidth=1)
    a.axvline(LOW_VALUE_NORM, color="grey", linestyle="--", linewidth=1)
    a.set_xlabel("value norm / median value norm of the head")
    a.set_ylabel("density")
    a.legend(fontsize=8)
    a.set_title("recorded top keys, all steps, layers and heads", fontsize=9)
    main = np.where(is_sink[..., 0] & ok[..., 0], rel[..., 0], np.nan)  # [T, L, H]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # heads that are never a sink
        med = np.nanmedian(main, axis=0)
    L, H = med.shape
    cmap = plt.get_cmap("coolwarm").with_extremes(bad="white")
    im = b.imshow(np.ma.masked_invalid(np.log2(med)), aspect="auto", cmap=cmap, vmin=-3, vmax=3,
                  origin="upper", interpolation="nearest")
    for l, h in _numbered_cells(L, H):
        b.text(h, l, "-" if not np.isfinite(med[l, h]) else f"{med[l, h]:.2f}",
               ha="center", va="center", fontsize=7)
    _layer_head_axes(b, L, H)
    fig.colorbar(im, ax=b, label="log2 of the ratio")
    b.set_title("main sink's value norm / head median, median over steps\n(blank: never a sink)",
                fontsize=9)
    fig.suptitle(f"Value norms of sinks: {_name(trace)}, steps 1-{trace.steps}, "
                 f"eps={trace.meta['eps']:g}", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=120, metadata={"Software": None})
    _plt().close(fig)
    return Path(path)


def draw_all(folder: Path, heads: str | None = None) -> dict[str, Path]:
    """Draw every figure from ``folder/trace.npz`` into ``folder``; ``heads`` are Fig. 7's,
    written as ``--heads`` takes them (``0:1,3:2``; default: the most sink-heavy)."""
    folder = Path(folder)
    trace = Trace.load(folder)
    fig7_heads = parse_heads(heads)
    return {
        "fig3": fig_score_distribution(trace, folder / FIGURES["fig3"]),
        "fig5": fig_main_sink_heatmap(trace, folder / FIGURES["fig5"]),
        "fig7": fig_sink_position(trace, folder / FIGURES["fig7"], fig7_heads),
        "fig10": fig_eps_selection(trace, folder / FIGURES["fig10"]),
        "stability": fig_stability(trace, folder / FIGURES["stability"]),
        **({"value_norms": fig_value_norms(trace, folder / FIGURES["value_norms"])}
           if "top_vnorm" in trace.arrays else {}),
    }
