"""Sink traces: the recorder against Eq. 3, the saved trace, a traced generation equal to an
unmasked one, and the four figures written from the trace alone."""

import re

import numpy as np
import pytest
import torch

from lm_eval_sinkmask import sink_trace
from lm_eval_sinkmask.cli import build_parser, main
from lm_eval_sinkmask.figures import FIGURES, draw_all, selected_share
from lm_eval_sinkmask.intercept import AttentionEvent
from lm_eval_sinkmask.metric import find_sinks
from lm_eval_sinkmask.provenance import checkpoint_digest
from lm_eval_sinkmask.sink_trace import (HIST_EDGES, TRACE_VERSION, Trace, TraceRecorder,
                                          parse_heads, trace_generation, value_norm_line)

PROMPT = "Tom has 3 apples . Anna gives 2 more . how many apples ?"


def event(step, layer, scores, value_norms=None):
    z = torch.zeros_like(scores, dtype=torch.bool)
    return AttentionEvent(step, layer, scores, z, z, z, value_norms=value_norms)


def synthetic_trace(steps=6, layers=2, heads=3, keys=20, seed=0, values=True) -> Trace:
    """Near-uniform scores plus one big sink per head that moves right one key per step; the
    sink's value norm is a quarter of the others' (1), when ``values``."""
    g = torch.Generator().manual_seed(seed)
    rec = TraceRecorder(eps=3.0, topn=3)
    for t in range(1, steps + 1):
        for l in range(layers):
            s = torch.rand(1, heads, keys, generator=g) * 0.5
            norms = torch.ones(1, heads, keys)
            for h in range(heads):
                s[0, h, (t + h + l) % keys] = 6.0 + h
                norms[0, h, (t + h + l) % keys] = 0.25
            rec(event(t, l, s * keys / s.sum(-1, keepdim=True),  # mean 1: uniform-share units
                      norms if values else None))
    meta = {"name": "synthetic", "kind": "dlm", "eps": 3.0, "top_k": 0, "steps": steps,
            "prompt_length": 5, "tokens": ["x"] * keys, "mask_id": None}
    return Trace(meta, rec.arrays(full_steps=3))


def test_recorder_keeps_top_keys_histogram_and_eq3_sinks():
    torch.manual_seed(0)
    rec = TraceRecorder(eps=1.0, topn=4)
    scores = torch.rand(1, 2, 10) * 2
    scores[0, 0, 7] = 9.0
    rec(event(1, 0, scores))
    rec(event(2, 0, scores[..., :6]))  # fewer keys than before (ARM prefill vs. later is the other way)
    a = rec.arrays(full_steps=2)
    assert a["top_pos"][0, 0, 0, 0] == 7 and a["top_score"][0, 0, 0, 0] == pytest.approx(9.0)
    assert a["top_pos"][0, 0, 1].tolist() == torch.topk(scores[0, 1], 4).indices.tolist()
    assert a["hist"][0, 0].sum(-1).tolist() == [10, 10] and a["hist"][1, 0].sum(-1).tolist() == [6, 6]
    assert len(HIST_EDGES) - 1 == a["hist"].shape[-1]
    want = find_sinks(scores[0], torch.ones(2, 10, dtype=torch.bool), 1.0).sum(-1)
    assert a["n_sinks"][0, 0].tolist() == want.tolist()
    assert a["n_keys"].tolist() == [10, 6]
    assert a["full_steps"].tolist() == [1, 2]
    assert np.isnan(a["full_scores"][1, 0, 0, 6:]).all()
    np.testing.assert_allclose(a["full_scores"][0, 0], scores[0].numpy(), rtol=1e-3)


def test_saved_trace_round_trips_and_agrees_with_eq3(tmp_path):
    trace = synthetic_trace()
    loaded = Trace.load(trace.save(tmp_path / "t"))
    assert loaded.meta == trace.meta and set(loaded.arrays) == set(trace.arrays)
    assert loaded.top_is_sink().all()  # every head's top key is a planted sink
    assert (loaded["top_pos"][:, 0, 0, 0] == np.arange(1, 7) % 20).all()  # ... and it moves
    full = loaded["full_scores"].astype(np.float64)
    share = selected_share(full, np.array([3.0]))[0]
    want = find_sinks(torch.tensor(full), torch.ones(full.shape, dtype=torch.bool), 3.0).double().mean(-1)
    np.testing.assert_allclose(share, want.numpy())


def test_a_saved_trace_stands_only_for_its_length_version_and_checkpoint(tmp_path):
    trace = synthetic_trace()
    trace.meta.update(trace_version=3, gen_length=64, checkpoint="sha256:a")
    folder = trace.save(tmp_path / "t")
    assert Trace.stands(folder, gen_length=64, checkpoint="sha256:a", min_version=3)
    assert not Trace.stands(folder, gen_length=128, checkpoint="sha256:a", min_version=3)
    assert not Trace.stands(folder, gen_length=64, checkpoint="sha256:b")  # retrained weights
    assert not Trace.stands(folder, gen_length=64, checkpoint=None)  # cannot tell: trace again
    assert not Trace.stands(folder, gen_length=64, checkpoint="sha256:a", min_version=4)
    assert not Trace.stands(folder, gen_length=64, checkpoint="sha256:a")  # older than this code's
    assert not Trace.stands(tmp_path / "none", gen_length=64, checkpoint="sha256:a")
    assert Trace.stands(folder, gen_length=64, checkpoint="sha256:a", min_version=3,
                        eps=trace.meta["eps"])
    assert not Trace.stands(folder, gen_length=64, checkpoint="sha256:a", min_version=3,
                            eps=trace.meta["eps"] + 1)  # its sinks were counted at another eps


def test_figures_from_a_saved_trace(tmp_path):
    folder = synthetic_trace().save(tmp_path / "t")
    paths = draw_all(folder, "0:1,1:2")
    for key, name in FIGURES.items():
        assert paths[key] == folder / name
        assert paths[key].read_bytes()[:4] == b"\x89PNG" and paths[key].stat().st_size > 10_000
    with pytest.raises(ValueError):
        draw_all(folder, "5:0")
    with pytest.raises(ValueError, match="layer:head pairs"):  # not int("")'s error
        parse_heads("3")


def test_value_norms_of_the_top_keys_are_relative_to_the_heads_median(tmp_path):
    rec = TraceRecorder(eps=1.0, topn=3)
    scores = torch.tensor([[[9.0, 0.5, 0.5, 2.0, 0.0]]])
    rec(event(1, 0, scores, value_norms=torch.tensor([[[0.5, 2.0, 4.0, 1.0, 3.0]]])))
    a = rec.arrays()
    # top keys 0, 3, then 1 or 2 (equal scores); median norm 2.0
    assert a["top_vnorm"][0, 0, 0, :2].tolist() == [0.25, 0.5]
    assert a["v_median"][0, 0, 0] == 2.0

    trace = Trace.load(synthetic_trace().save(tmp_path / "t"))
    block = trace.value_norms()
    assert block["main_sinks"]["median"] == pytest.approx(0.25)
    assert block["main_sinks"]["share_low"] == 1.0 and block["other_top_keys"]["median"] == 1.0
    assert block["main_sinks"]["n"] == 6 * 2 * 3
    assert block["main_sink_median_per_layer"] == [pytest.approx(0.25)] * 2
    assert "main sinks median 0.25" in value_norm_line(block)


def test_traces_without_value_norms_still_load_and_draw(tmp_path):
    folder = synthetic_trace(values=False).save(tmp_path / "old")
    trace = Trace.load(folder)
    assert trace.value_norms() is None
    assert "not in this trace" in value_norm_line(None)
    paths = draw_all(folder)
    assert "value_norms" not in paths and set(paths) == set(FIGURES) - {"value_norms"}


def test_figures_of_a_folder_with_no_trace_says_so_in_one_line(tmp_path, capsys):
    assert main(["figures", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sinkmask: error:") and "no trace.npz" in err and "sinkmask sinks" in err


@pytest.mark.parametrize("kind, args", [("llada", "block_length=4"), ("llama", "")])
def test_traced_generation_is_the_unmasked_generation(tmp_path, tiny_dirs, kind, args):
    trace = trace_generation(str(tiny_dirs[kind]), PROMPT, gen_length=8, model_args=args,
                             device="cpu", eps=0.0, full_steps=3)
    m = trace.meta
    # eps=0: there are sinks to observe (and, below, they were left unmasked)
    assert m["kind"] == ("arm" if kind == "llama" else "dlm") and m["counters"]["keys_masked"] == 0
    assert trace["n_sinks"].sum() > 0
    assert (m["layers"], m["heads"]) == (2, 4)
    if kind == "llada":
        assert m["steps"] == 8 and trace["inputs"].shape[0] == 8  # one pass per denoising step
        assert (trace["inputs"][0, m["prompt_length"]:] == m["mask_id"]).all()
    else:
        assert 1 <= m["steps"] <= 8
    n = trace["n_keys"]
    assert (trace["hist"].sum(-1) == n[:, None, None]).all()
    assert m["trace_version"] == TRACE_VERSION and m["key_offset"] == 0 and "n" in m["value_norms"]["sinks"]
    assert m["checkpoint"] == checkpoint_digest(str(tiny_dirs[kind]))
    assert trace["top_vnorm"].shape == trace["top_score"].shape
    assert np.isfinite(trace["top_vnorm"][..., 0]).all() and (trace["v_median"] > 0).all()

    # the observer changes nothing: the same tokens as the model class at top_k=0
    from lm_eval.api.registry import get_model
    from lm_eval.utils import simple_parse_args_string

    cls = get_model("dlm_sinkmask" if kind == "llada" else "arm_sinkmask")
    extra = simple_parse_args_string(args) if args else {}
    lm = cls(pretrained=str(tiny_dirs[kind]), device="cpu", top_k=0, **extra)
    ids, mask = lm.tok_batch_encode([PROMPT])
    kw = {"attention_mask": mask} | ({"do_sample": False} if kind == "llama" else {})
    plain = lm._model_generate(ids, ids.shape[1] + 8, [], **kw)[0, ids.shape[1]:]
    assert m["completion"] == lm.tokenizer.decode(plain, skip_special_tokens=True)


@pytest.mark.parametrize("kind, args, message", [
    ("llada", ["--eps", "nan"], r"--eps must be a finite number, got nan"),
    ("llada", ["--model-args", "top_k=5"], r"top_k in --model-args: the trace sets it \(--top-k\)"),
    ("llada", ["--model-args", "pretrained=x"], r"pretrained in --model-args: the trace sets it \(--model\)"),
    ("llada", ["--model-args", "block_length=4,gen_length=8"], r"gen_length in --model-args: the trace sets it"),
    ("llada", ["--gen-length", "0"], r"--gen-length must be >= 1, got 0"),
    ("llada", ["--gen-length", "40"], r"gen_length=40 must be a multiple of block_length=32"),
    ("llada", ["--topn", "0"], r"--topn must be >= 1, got 0"),
    # Fig. 10 sweeps eps over the kept full score vectors: none kept crashed after generating
    ("llada", ["--full-steps", "0"], r"--full-steps must be >= 1, got 0"),
    ("llada", ["--top-k", "-1"], r"--top-k must be >= 0, got -1"),
    ("llama", ["--steps", "4"], r"--steps sets a diffusion LM's denoising steps; an ARM decodes one token per step"),
    # the figures refused it only once the whole trace had run
    ("llada", ["--heads", "2:0"], r"--heads 2:0 is outside the checkpoint's 2 layers x 4 heads"),
    ("llama", ["--heads", "0:4"], r"--heads 0:4 is outside the checkpoint's 2 layers x 4 heads"),
    # --prompt "$UNSET": traced the model's answer to nothing
    ("llada", ["--prompt", " "], r"the prompt is empty"),
])
def test_sinks_refuses_what_it_would_trace_wrongly_before_loading(tmp_path, tiny_dirs, capsys, kind, args, message):
    """A folder with a config.json and no weights: loading would fail with another error."""
    folder = tmp_path / kind
    folder.mkdir()
    (folder / "config.json").write_text((tiny_dirs[kind] / "config.json").read_text())
    assert main(["sinks", "--model", str(folder), "--prompt", PROMPT, "--out", str(tmp_path / "out"),
                 "--device", "cpu", *args]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("top_k", [0, 1])
def test_an_arm_trace_checks_its_request_as_a_run_does(tmp_path, tiny_dirs, top_k):
    """A checkpoint whose generation_config.json asks for beam search: generate_until refuses
    it masked, and the trace, which calls the model's generate itself, did not ask and traced
    beam search's reordered cache. Tracing an unmasked run, the refusal cannot offer to run
    unmasked: the trace scores every call either way."""
    import json
    import shutil

    folder = shutil.copytree(tiny_dirs["llama"], tmp_path / "beams")
    generation = folder / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "num_beams": 2}))
    with pytest.raises(ValueError, match=r"num_beams=2 \(from .*beam_search mode") as refused:
        trace_generation(str(folder), PROMPT, gen_length=4, device="cpu", top_k=top_k)
    tail = "A trace scores every attention call even under --top-k 0"
    assert (tail in str(refused.value)) == (top_k == 0)


def test_an_arm_trace_counts_the_keys_of_the_sequence_not_a_static_caches_slots(tmp_path, tiny_dirs):
    """A checkpoint that asks for a static cache: its unwritten slots were traced as keys
    (n_keys the cache's length at every step, Eq. 3 scores averaging below 1)."""
    import json
    import shutil

    folder = shutil.copytree(tiny_dirs["llama"], tmp_path / "static")
    generation = folder / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()),
                                      "cache_implementation": "static"}))
    trace = trace_generation(str(folder), PROMPT, gen_length=4, device="cpu")
    prompt = trace.meta["prompt_length"]
    assert trace["n_keys"].tolist() == [prompt + t for t in range(trace.meta["steps"])]
    mean = np.nanmean(trace["total"], axis=(1, 2)) / trace["n_keys"]
    np.testing.assert_allclose(mean, 1.0, rtol=1e-5)


def test_an_unmasked_trace_of_a_sliding_window_checkpoint_is_refused_as_a_trace(tmp_path, tiny_dirs):
    import json

    folder = tmp_path / "window"
    folder.mkdir()
    config = json.loads((tiny_dirs["llama"] / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 6}))
    with pytest.raises(ValueError, match=r"Pass max_length=6.*or run unmasked \(top_k=0\)\. "
                                         r"A trace scores every attention call even under --top-k 0"):
        trace_generation(str(folder), PROMPT, gen_length=4, device="cpu")


@pytest.mark.slow
def test_sinks_and_figures_commands(tmp_path, tiny_dirs, capsys):
    out = tmp_path / "dream"
    assert main(["sinks", "--model", str(tiny_dirs["dream"]), "--prompt", PROMPT, "--out", str(out),
                 "--gen-length", "6", "--steps", "3", "--eps", "0.2", "--device", "cpu"]) == 0
    trace = Trace.load(out)
    assert trace.meta["steps"] == 3 and trace.meta["family"] == "dream"
    assert all((out / name).stat().st_size > 10_000 for name in FIGURES.values())
    for name in FIGURES.values():
        (out / name).unlink()
    assert main(["figures", str(out), "--heads", "1:0"]) == 0
    assert all((out / name).exists() for name in FIGURES.values())
    assert "fig10" in capsys.readouterr().out


def test_fig7_prompt_boundary_label_sits_outside_the_data(tmp_path, monkeypatch):
    import lm_eval_sinkmask.figures as figures

    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    figures.fig_sink_position(synthetic_trace(), tmp_path / "fig7.png", [(0, 1), (1, 2)])
    fig = drawn["fig"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    plot, page = ax.get_window_extent(renderer), fig.bbox
    labels = [t for t in fig.findobj() if getattr(t, "get_gid", lambda: None)() == "prompt-boundary"]
    assert [t.get_text() for t in labels] == ["\u2191 prompt", "\u2193 generation"]
    for t in labels:
        box = t.get_window_extent(renderer)
        assert box.x0 >= plot.x1, "the label overlaps the plot area, where data lines run"
        assert box.x1 <= page.x1 and box.y0 >= page.y0 and box.y1 <= page.y1, "the label is cut off"


def test_value_norm_median_of_an_even_number_of_keys_is_the_middle_pair_mean():
    # four keys: the median value norm is (2 + 4) / 2 = 3, not the lower middle value 2
    rec = TraceRecorder(eps=1.0, topn=2)
    scores = torch.tensor([[[9.0, 0.5, 0.3, 0.2]]])
    rec(event(1, 0, scores, value_norms=torch.tensor([[[6.0, 2.0, 4.0, 1.0]]])))
    a = rec.arrays()
    assert a["v_median"][0, 0, 0] == pytest.approx(np.median([6.0, 2.0, 4.0, 1.0]))
    assert a["top_vnorm"][0, 0, 0].tolist() == pytest.approx([2.0, 2.0 / 3.0])


def test_fig7_shows_a_sink_on_the_extra_token_after_the_text(tmp_path, monkeypatch):
    """A sink token at the end ("end" position) is the key just after the last text token:
    key_offset 0, one key more than meta["tokens"]; Fig. 7 must keep it inside the axes."""
    import lm_eval_sinkmask.figures as figures

    keys, steps = 11, 4
    rec = TraceRecorder(eps=3.0, topn=2)
    for t in range(1, steps + 1):
        s = torch.full((1, 1, keys), 0.5)
        s[0, 0, keys - 1] = 20.0  # the extra token, after the 10 text tokens
        rec(event(t, 0, s * keys / s.sum(-1, keepdim=True)))
    meta = {"name": "end-sink", "kind": "dlm", "eps": 3.0, "top_k": 0, "steps": steps,
            "prompt_length": 4, "tokens": ["x"] * (keys - 1), "mask_id": None, "key_offset": 0}
    trace = Trace(meta, rec.arrays())
    assert trace.main_sink()[0][:, 0, 0].tolist() == [keys - 1] * steps
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    figures.fig_sink_position(trace, tmp_path / "fig7.png", [(0, 0)])
    (ax,) = drawn["fig"].axes
    lo, hi = sorted(ax.get_ylim())
    assert lo <= keys - 1 <= hi, f"the sink at key {keys - 1} is outside the y range {lo}..{hi}"
    assert ax.get_ylabel().endswith("(token index)")  # no key before the text: keys are tokens
    trace.meta["key_offset"] = 1  # a sink token first: key i is text token i - 1
    drawn.clear()
    figures.fig_sink_position(trace, tmp_path / "fig7.png", [(0, 0)])
    assert drawn["fig"].axes[0].get_ylabel().endswith("(key index = token index + 1)")


def test_eps_selection_and_fig5_leave_out_layers_the_trace_did_not_score(tmp_path, monkeypatch):
    """With layers= (masking some layers), the intercept scores only those layers: the others
    have no keys in the trace and must not count as 'no key selected'."""
    import lm_eval_sinkmask.figures as figures

    rec = TraceRecorder(eps=3.0, topn=2)
    for t in (1, 2):
        s = torch.full((1, 2, 10), 0.5)
        s[0, :, 3] = 20.0
        rec(event(t, 1, s * 10 / s.sum(-1, keepdim=True)))  # layer 1 only; layer 0 untraced
    meta = {"name": "layers", "kind": "dlm", "eps": 3.0, "top_k": 1, "steps": 2,
            "prompt_length": 4, "tokens": ["x"] * 10, "mask_id": None}
    trace = Trace(meta, rec.arrays())
    share = selected_share(trace["full_scores"], np.array([3.0]))[0]  # [F, L, H]
    assert np.isnan(share[:, 0]).all() and share[:, 1] == pytest.approx(0.1)
    titles = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: titles.append(
        [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]))
    figures.fig_eps_selection(trace, tmp_path / "fig10.png")
    assert any("eps=3: 10.0% selected" in t for t in titles[-1])
    figures.fig_main_sink_heatmap(trace, tmp_path / "fig5.png")
    assert any("in 100% of (step, layer, head)" in t for t in titles[-1])
    # stability counts only the scored heads, and its figure marks the others as not scored
    g = trace.stability()["aggregate"]
    assert (g["heads"], g["heads_with_sink"], g["keep_rate"]) == (2, 2, 1.0)
    figures.fig_stability(trace, tmp_path / "stability.png")
    assert any("over 2/2 heads" in t for t in titles[-1])
    assert sum(t.startswith("not\nscored") for t in titles[-1]) == 4  # 2 heads x 2 panels


def test_top_is_sink_compares_with_the_mean_of_the_other_keys_as_the_recorder_does():
    # |K| = 2, eps = 3: 3.4 is not above the other key's 0.6 + 3 (a mean over |K| rather than
    # |K| - 1 keys would put the bar at 0.3 + 3 and call it a sink); 3.7 is.
    rec = TraceRecorder(eps=3.0, topn=2)
    rec(event(1, 0, torch.tensor([[[3.4, 0.6], [3.7, 0.3]]])))
    g = torch.Generator().manual_seed(0)
    rec(event(2, 0, torch.rand(1, 2, 5, generator=g) * torch.tensor([[[9.0], [2.0]]])))
    trace = Trace({"eps": 3.0}, rec.arrays(full_steps=2))
    assert trace.top_is_sink()[0, 0].tolist() == [False, True]
    # the top key is a sink exactly where the recorder found any sink (metric.find_sinks)
    np.testing.assert_array_equal(trace.top_is_sink(), trace["n_sinks"] > 0)


def test_a_score_on_a_bin_edge_is_counted_in_the_bin_it_opens():
    # bins are [edge_i, edge_i+1): uniform attention (every score 1.0) is in [1, 2)
    rec = TraceRecorder(eps=3.0, topn=1)
    scores = torch.tensor([[[1.0, 1.0, 1.0, 1.0], [0.0, 1 / 16, 2.0, 1024.0]]])
    rec(event(1, 0, scores))
    hist = rec.arrays(full_steps=1)["hist"][0, 0]
    one = int(np.flatnonzero(HIST_EDGES == 1.0)[0])
    assert hist[0].tolist() == [4 if i == one else 0 for i in range(len(HIST_EDGES) - 1)]
    bins = [int(np.flatnonzero(HIST_EDGES == e)[0]) for e in (0.0, 1 / 16, 2.0, 1024.0)]
    assert np.flatnonzero(hist[1]).tolist() == bins and hist[1].sum() == 4


def test_selected_share_is_eq3_at_every_eps():
    # key 0: 6 against the others' mean 1 (over 3 keys, not 4): a margin of exactly 5
    assert selected_share(np.array([[6.0, 1, 1, 1]]), np.array([4.9, 5.1]))[:, 0].tolist() == [0.25, 0.0]
    scores = np.random.default_rng(0).exponential(size=(64, 7))
    eps_grid = np.linspace(0, 4, 41)
    got = selected_share(scores, eps_grid)
    valid = torch.ones(scores.shape, dtype=torch.bool)
    want = np.stack([find_sinks(torch.tensor(scores), valid, e).double().mean(-1).numpy()
                     for e in eps_grid])
    np.testing.assert_allclose(got, want)


def test_the_help_of_model_args_names_every_setting_the_trace_refuses_there(capsys):
    """``sinkmask sinks --help`` listed five of the eight: granularity=layer was refused
    with no word of it in the help."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sinks", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    said = help_text.split("--model-args MODEL_ARGS ")[1].split(" --device")[0]
    assert all(name in said for name in sink_trace._SET_BY_TRACE), said
