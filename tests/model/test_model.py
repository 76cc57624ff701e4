"""minillama.model: the numpy forward pass, teacher-forced on llama.cpp's own greedy continuations, and the errors a
user's file or input can cause.

tests/data/smollm2_llamacpp_greedy.json holds llama.cpp's greedy continuations of tools/model_prompts.txt (prose,
code, chat-template prompts) with its top-5 log-probs at every position, made by tools/make_model_expected.py from
SmolLM2-135M-Instruct.Q4_1.gguf. The real-model tests use the GGUF MINILLAMA_TEST_GGUF points to and skip without it.
"""

from __future__ import annotations

import functools
import gc
import json
import re
from pathlib import Path

import numpy as np
import pytest
from support import DATA
from support.batching import steps_together_and_alone
from support.paths import real_gguf as _real_gguf
from support.server_fed import LLAMACPP_THREADS, feed_as_server, llamacpp, server_fed

from minillama.errors import ArgumentError, ContextLengthError, FormatError, MinillamaError, UnsupportedError
from minillama.generate import Sampler
from minillama.model import Model
from minillama.tokenizer import default_vocab_path

gguf = pytest.importorskip("gguf")

EXPECTED = DATA / "smollm2_llamacpp_greedy.json"




@functools.cache
def _smollm2(path: str) -> Model:
    return Model.from_file(path, kv_split=LLAMACPP_THREADS)


@pytest.fixture(scope="module")
def smollm2() -> Model:
    return _smollm2(str(_real_gguf()))


def expected_cases() -> list[dict]:
    """llama.cpp's aligned greedy continuations (the only ones that are position by position)."""
    data = json.loads(EXPECTED.read_text(encoding="utf-8"))
    assert data["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    return [c for c in data["cases"] if c["aligned"]]


def margin(top: list[list[float]]) -> float:
    """llama.cpp's log-prob gap between its first and second choice."""
    return top[0][1] - top[1][1] if len(top) > 1 else float("inf")


def agreement(choices: list[tuple[int, dict]]) -> dict[float, tuple[int, int]]:
    """(positions, agreeing positions) at llama.cpp margins >= 0.5 and >= 0.1; choices: (our argmax, llama.cpp's)."""
    out = {}
    for th in (0.5, 0.1):
        seen = [(ours, g["id"]) for ours, g in choices if margin(g["top"]) >= th]
        out[th] = (len(seen), sum(a == b for a, b in seen))
    return out


def test_teacher_forced_logits_agree_with_llamacpp(smollm2: Model) -> None:
    choices = []
    for case in expected_cases():
        gen = [g["id"] for g in case["gen"]]
        n = len(case["prompt_ids"])
        logits = smollm2.logits(case["prompt_ids"] + gen[:-1])
        assert logits.shape == (n + len(gen) - 1, smollm2.n_vocab) and logits.dtype == np.float32
        choices += zip(logits[n - 1:].argmax(-1).tolist(), case["gen"], strict=True)
    stats = agreement(choices)
    n05, ok05 = stats[0.5]
    n01, ok01 = stats[0.1]
    assert n05 >= 150, "too few confident positions for the test to mean anything"
    assert ok05 == n05, f"argmax differs from llama.cpp at {n05 - ok05} of {n05} positions with margin >= 0.5"
    assert ok01 >= 0.98 * n01, f"agreement {ok01}/{n01} at margin >= 0.1, expected >= 98%"


def test_native_log_probs_equal_llamacpp(smollm2: Model) -> None:
    """On the native backend with the AVX2 kernels (ggml's own float order: what llama.cpp runs on this CPU),
    every block of SmolLM2 computes llama.cpp's bits, so the log-probs of llama.cpp's top 5 match to what separates
    its server from its own direct decode (0.0001 on average), not to the 0.08 a float32 pass is off by."""
    if not smollm2._native or smollm2._stack is None:
        pytest.skip("the native backend's C blocks are not in use (MINILLAMA_BACKEND=pure or no native core)")
    from minillama._native import _core

    if _core.kernels() != "avx2":
        pytest.skip(f"the {_core.kernels()} kernels sum in ggml's generic order, not its AVX2 one")
    # fed as the server fed llama.cpp: a prompt and its continuation in one pass of 64 rows or more would take
    # llama.cpp's tiled attention, which its server's single-token steps do not
    _, diffs = feed_as_server(smollm2, expected_cases())
    assert len(diffs) >= 1000
    assert np.mean(diffs) < 0.002, f"mean |log-prob difference| {np.mean(diffs):.4f}"
    assert np.max(diffs) < 0.02, f"max |log-prob difference| {np.max(diffs):.4f}"


def test_prompts_of_64_tokens_and_more_fed_as_llamacpps_server_give_its_log_probs(smollm2: Model) -> None:
    """Prompts of 70, 110 and 200 tokens fed as llama.cpp's server feeds them (a first batch of 64 rows or more:
    llama.cpp's tiled flash attention) give llama.cpp's log-probs, fed the same way, to their stored rounding."""
    if not smollm2._native or smollm2._stack is None:
        pytest.skip("the native backend's C blocks are not in use (MINILLAMA_BACKEND=pure or no native core)")
    from minillama._native import _core

    if _core.kernels() != "avx2":
        pytest.skip(f"the {_core.kernels()} kernels sum in ggml's generic order, not its AVX2 one")
    stored = server_fed("SmolLM2-135M-Instruct.Q4_1.gguf")
    wrong, diffs = feed_as_server(smollm2, stored["cases"])
    assert not wrong, wrong[:5]
    assert len(diffs) >= 3 * 16 * 5
    assert np.mean(diffs) < 1e-4 and np.max(diffs) < 1e-4, (np.mean(diffs), np.max(diffs))


@pytest.mark.slow
def test_gemma3_past_its_sliding_window_cache_gives_llamacpps_server_log_probs() -> None:
    """Gemma-3-270m (the file MINILLAMA_TEST_GEMMA3_GGUF names: gemma-3-270m-q4_k_m.gguf) on a prompt of 1,100
    tokens, past the 1,024 cells of llama-server's sliding-window cache: its last ubatch and every step reuse the
    cells of positions out of the window, and attention visits cells in that order. The log-probs equal llama.cpp's,
    fed as its server feeds them (they were 0.1-1.2 off from position 1,024 on when attention went in position
    order)."""
    import os

    path = os.environ.get("MINILLAMA_TEST_GEMMA3_GGUF")
    if not path or not Path(path).is_file():
        pytest.skip("MINILLAMA_TEST_GEMMA3_GGUF does not name gemma-3-270m-q4_k_m.gguf; tests never download")
    m = Model.from_file(path, kv_split=LLAMACPP_THREADS)
    if not m._native or m._stack is None:
        pytest.skip("the native backend's C blocks are not in use (MINILLAMA_BACKEND=pure or no native core)")
    from minillama._native import _core

    if _core.kernels() != "avx2":
        pytest.skip(f"the {_core.kernels()} kernels sum in ggml's generic order, not its AVX2 one")
    stored = server_fed(Path(path).name)
    assert max(len(c["prompt_ids"]) for c in stored["cases"]) > 1024
    wrong, diffs = feed_as_server(m, stored["cases"])
    assert not wrong, wrong[:5]
    assert np.mean(diffs) < 1e-4 and np.max(diffs) < 1e-4, (np.mean(diffs), np.max(diffs))


def test_context_shift_gives_llamacpps_logits(smollm2: Model) -> None:
    """Session.shift_context as llama-server's context shift (seq_rm of n_discard positions after n_keep, seq_add of
    the later ones, their keys rotated back): the cells then hold [kept][new][old moved back], visited in that
    order, and every step after it gives llama.cpp's logits bit for bit (llama_decode, with llama_memory_seq_rm and
    llama_memory_seq_add), in a context of 256 positions; on the pure backend, to its float32 tolerance."""
    if not smollm2.can_shift(256):
        with pytest.raises(UnsupportedError, match="context shift needs"):
            smollm2.session(256).shift_context(10, 100)
        pytest.skip("no context shift here: the native backend's C blocks are not in use")
    if smollm2._native:
        from minillama._native import _core

        if _core.kernels() != "avx2":
            pytest.skip(f"the {_core.kernels()} kernels sum in ggml's generic order, not its AVX2 one")
    case = server_fed("SmolLM2-135M-Instruct.Q4_1.gguf")["cases"][2]
    prompt, gen = case["prompt_ids"], [g["id"] for g in case["gen"]][:12]
    ref = llamacpp(smollm2.path, 256).teacher_forced(prompt, gen, len(prompt) - 4, shift=(4, 10, 100))
    s = smollm2.session(256)
    s.logits_next(prompt[:-4])
    ids, rows = list(prompt), [s.logits_next(prompt)]
    for i, g in enumerate(gen[:-1]):
        if i + 1 == 4:
            s.shift_context(10, 100)
            del ids[10:110]
        ids.append(g)
        rows.append(s.logits_next(ids))
    assert len(s.cached_ids) == len(prompt) + len(gen) - 1 - 100
    if smollm2._native:
        np.testing.assert_array_equal(np.stack(rows), ref)
    else:  # the pure backend's float32 blocks, the keys rotated in numpy (Model._rope_shift): they are up to ~1
        # logit off llama.cpp's on this context before the shift as after it (3-5 off when the keys keep their
        # rotation); llama.cpp's confident choices
        got, top2 = np.stack(rows), np.sort(ref, axis=-1)[:, -2:]
        assert np.abs(got - ref)[4:].max() < 1.5
        confident = top2[:, 1] - top2[:, 0] > 0.5
        assert confident.sum() >= 6 and (got.argmax(-1) == ref.argmax(-1))[confident].all()


def test_cached_steps_agree_with_llamacpp(smollm2: Model) -> None:
    """next_token one token at a time (the KV cache path) makes llama.cpp's confident choices too."""
    greedy = Sampler(temperature=0)
    choices = []
    for case in expected_cases()[:3]:
        ids = list(case["prompt_ids"])
        for g in case["gen"][:24]:
            choices.append((smollm2.next_token(ids, greedy), g))
            ids.append(g["id"])
    n05, ok05 = agreement(choices)[0.5]
    assert n05 >= 40 and ok05 == n05


def test_cache_reuses_prefix_and_matches_fresh_pass(smollm2: Model) -> None:
    ids = expected_cases()[0]["prompt_ids"]
    fresh = smollm2.logits(ids)

    class Keep(Sampler):
        def sample_logits(self, logits, ids=None):
            self.seen = np.asarray(logits)
            return int(np.argmax(self.seen))

    s = Keep(temperature=0)
    smollm2.reset()
    smollm2.next_token(ids[:5], s)
    smollm2.next_token(ids, s)  # the first five positions come from the cache
    assert smollm2._cache.n == len(ids)
    np.testing.assert_allclose(s.seen, fresh[-1], atol=1e-2)
    smollm2.next_token(ids[:3] + ids[4:], s)  # diverges at position 3: recomputed from there
    np.testing.assert_allclose(s.seen, smollm2.logits(ids[:3] + ids[4:])[-1], atol=1e-2)
    # on the native backend too: its blocks compute a position's row the same way whatever chunk holds it
    # (numpy's attention rounded by the batch's row count, and 8-bit activations grew that to 0.5 in the logits)
    np.testing.assert_allclose(smollm2.logits(ids)[-2], fresh[-2], atol=1e-2)


def test_batched_steps_equal_lone_steps(smollm2: Model) -> None:
    """Single-token steps of four sequences in one pass (a server's slots decoding together) equal each sequence
    stepping alone: the same bits on the native backend (its C blocks and kernels compute each row alone), to
    float rounding on the pure one (BLAS sums a product of four rows in another order than one row's)."""
    prompts = [expected_cases()[0]["prompt_ids"], [1, 2, 3], expected_cases()[1]["prompt_ids"][:7], [42]]
    got, want = steps_together_and_alone(smollm2, prompts, 5)
    if smollm2._stack is not None:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, atol=1e-3 * np.abs(want).max())


def test_input_errors(smollm2: Model) -> None:
    with pytest.raises(ArgumentError, match="at least one token"):
        smollm2.logits([])
    with pytest.raises(ArgumentError, match="out of range"):
        smollm2.logits([1, smollm2.n_vocab])
    with pytest.raises(ContextLengthError, match=f"context of {smollm2.n_ctx} tokens"):
        smollm2.next_token([1] * (smollm2.n_ctx + 1), Sampler(temperature=0))


# ---------------------------------------------------------------------------------------------------------------------
# bad files: the built-in vocab-only GGUF and tiny models written here with gguf.GGUFWriter
# ---------------------------------------------------------------------------------------------------------------------

TINY = {"n_embd": 32, "n_ff": 48, "n_head": 4, "n_head_kv": 2, "n_vocab": 50, "n_ctx": 16}


def tiny_tensors(drop: str = "", reshape: str = "") -> dict[str, np.ndarray]:
    """Random float32 tensors of a one-block llama, numpy shapes (ne1, ne0); one dropped or mis-shaped."""
    d, f, hd = TINY["n_embd"], TINY["n_ff"], TINY["n_embd"] // TINY["n_head"]
    kv = TINY["n_head_kv"] * hd
    shapes = {"token_embd.weight": (TINY["n_vocab"], d), "output_norm.weight": (d,),
              "blk.0.attn_norm.weight": (d,), "blk.0.attn_q.weight": (d, d), "blk.0.attn_k.weight": (kv, d),
              "blk.0.attn_v.weight": (kv, d), "blk.0.attn_output.weight": (d, d), "blk.0.ffn_norm.weight": (d,),
              "blk.0.ffn_gate.weight": (f, d), "blk.0.ffn_up.weight": (f, d), "blk.0.ffn_down.weight": (d, f)}
    rng = np.random.default_rng(0)
    out = {}
    for name, shape in shapes.items():
        if name == drop:
            continue
        if name == reshape:
            shape = (shape[0] + 32, *shape[1:])
        out[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    return out


def write_tiny(path: Path, arch: str = "llama", **kw: str) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(TINY["n_ctx"])
    w.add_embedding_length(TINY["n_embd"])
    w.add_feed_forward_length(TINY["n_ff"])
    w.add_head_count(TINY["n_head"])
    w.add_head_count_kv(TINY["n_head_kv"])
    w.add_layer_norm_rms_eps(1e-5)
    for name, arr in tiny_tensors(**kw).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_model_runs(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    m = Model.from_file(write_tiny(tmp_path / "tiny.gguf"), progress=lambda done, total: seen.append((done, total)))
    d, f, kv = TINY["n_embd"], TINY["n_ff"], TINY["n_embd"] // TINY["n_head"] * TINY["n_head_kv"]
    total = 2 * d + 2 * d * d + 2 * kv * d + 3 * f * d + TINY["n_vocab"] * d  # block weights + tied output
    assert [t for _, t in seen] == [total] * 10 and seen[-1][0] == total
    assert all(a[0] < b[0] for a, b in zip(seen, seen[1:], strict=False))
    assert m.logits([1, 2, 3]).shape == (3, TINY["n_vocab"])
    with pytest.raises(ContextLengthError, match="17 tokens do not fit the model's context of 16"):
        m.logits(list(range(17)))


def test_long_inputs_go_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass split into chunks that attend to the cache gives the logits of one whole pass."""
    import minillama.model as mm

    m = Model.from_file(write_tiny(tmp_path / "tiny.gguf"))
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    whole = m.logits(ids)
    monkeypatch.setattr(mm, "CHUNK", 4)
    np.testing.assert_allclose(m.logits(ids), whole, rtol=1e-5, atol=1e-5)
    assert m.next_token(ids, Sampler(temperature=0)) == int(np.argmax(whole[-1]))


def test_vocab_only_gguf() -> None:
    with pytest.raises(FormatError, match="no tensors at all.*vocab-only") as e:
        Model.from_file(default_vocab_path())
    assert str(default_vocab_path()) in str(e.value)


def test_missing_tensor(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "missing.gguf", drop="blk.0.ffn_up.weight")
    with pytest.raises(FormatError, match=r"expected a tensor 'blk\.0\.ffn_up\.weight', not found") as e:
        Model.from_file(path)
    assert str(path) in str(e.value)


def test_wrong_shape(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "shape.gguf", reshape="blk.0.attn_k.weight")
    with pytest.raises(FormatError, match=r"blk\.0\.attn_k\.weight has shape \[32, 48\], expected \[32, 16\]"):
        Model.from_file(path)


def test_unknown_architecture(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "arch.gguf", arch="mamba")
    with pytest.raises(UnsupportedError, match="architecture 'mamba' is not supported") as e:
        Model.from_file(path)
    assert isinstance(e.value, MinillamaError)


# ---------------------------------------------------------------------------------------------------------------------
# minillama generate
# ---------------------------------------------------------------------------------------------------------------------

def test_cli_generate_streams_greedy_continuation(capsys: pytest.CaptureFixture[str]) -> None:
    from minillama.cli import main

    gguf_path = str(_real_gguf())
    assert main(["generate", "--model", gguf_path, "--temperature", "0", "--max-tokens", "4",
                 "The capital of France is"]) == 0
    assert capsys.readouterr().out == " Paris.\n\n"  # llama.cpp's greedy choices: ' Paris', '.', '\n', '\n'
    # one thread or two: the same greedy choices (-t is llama.cpp's flag)
    for threads in ("1", "2"):
        assert main(["generate", "--model", gguf_path, "-t", threads, "--temperature", "0", "--max-tokens", "4",
                     "The capital of France is"]) == 0
        assert capsys.readouterr().out == " Paris.\n\n"


def test_cli_generate_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from minillama.cli import main

    assert main(["generate", "--model", str(default_vocab_path()), "hello"]) == 2
    err = capsys.readouterr().err
    assert "no tensors at all" in err and str(default_vocab_path()) in err and "Traceback" not in err
    assert main(["generate", "--model", str(default_vocab_path()), "--top-p", "0", "hello"]) == 2
    assert "expected --top-p in (0, 1]" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------------
# --seed -1, -t bounds, a prompt longer than the context, timings apart, threads under load, the load bar
# ---------------------------------------------------------------------------------------------------------------------

def test_cli_generate_seed_threads_and_long_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    from minillama.cli import main
    from minillama.model.threads import usable_cores

    gguf_path = str(_real_gguf())
    # --seed -1: a random seed, as llama.cpp's (numpy raised ValueError)
    assert main(["generate", "--model", gguf_path, "--seed", "-1", "--max-tokens", "2", "-v", "Hello"]) == 0
    err = capsys.readouterr().err
    # prompt and generation apart, llama_perf_context_print's lines
    assert re.search(r"prompt eval time = +[\d.]+ ms / +\d+ tokens \( *[\d.]+ ms per token, +[\d.]+ tokens per second\)",
                     err), err
    assert re.search(r"\n +eval time = +[\d.]+ ms / +1 runs", err) and re.search(r"first token = +[\d.]+ ms", err), err
    assert main(["generate", "--model", gguf_path, "--seed", "-2", "Hello"]) == 2
    assert "expected a --seed of 0 or more (or -1 for a random one), found -2" in capsys.readouterr().err
    # -t beyond the cores this process may use (100000 made generation 47x slower)
    assert main(["generate", "--model", gguf_path, "-t", "100000", "Hello"]) == 2
    assert f"expected --threads from 1 to {usable_cores()} (the cores this process may use), found 100000" in \
        capsys.readouterr().err
    # a prompt longer than the context: exit 2 naming both lengths (it printed nothing and exited 0)
    n_ctx = _smollm2(gguf_path).n_ctx
    assert main(["generate", "--model", gguf_path, "a" + " a" * n_ctx]) == 2
    out = capsys.readouterr()
    assert out.out == "" and re.search(rf"the prompt has {n_ctx + 1} tokens but the model's context holds {n_ctx}",
                                       out.err), out.err


def mapped_bytes(path: str) -> dict[str, int]:
    """Bytes of path's pages mapped into this process: the Rss of each of its maps in /proc/self/smaps, by address
    range."""
    maps, at = {}, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
            at = line.split()[0] if line.rstrip().endswith(path) else None
        elif at and line.startswith("Rss:"):
            maps[at] = int(line.split()[1]) * 1024
    return maps


def test_native_load_maps_every_page_of_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's loader maps a model with MAP_POPULATE; so does a native load (the weights stay in the map), or
    the first prompt takes a page fault every few pages of weights on both threads."""
    if not Path("/proc/self/smaps").exists():
        pytest.skip("needs Linux's /proc/self/smaps")
    monkeypatch.setenv("MINILLAMA_BACKEND", "native")
    path = str(_real_gguf().resolve())
    gc.collect()  # a dropped model's map could be unmapped mid-load and its addresses taken by the new one
    before = mapped_bytes(path)
    m = Model.from_file(path, threads=1)
    if m._stack is None:
        pytest.skip("the native core is not built")
    new = sum(rss for at, rss in mapped_bytes(path).items() if at not in before)
    assert new >= 0.95 * Path(path).stat().st_size


def test_threads_are_capped_at_the_usable_cores(tmp_path: Path) -> None:
    from minillama.model.threads import usable_cores

    path = write_tiny(tmp_path / "tiny.gguf")
    assert Model.from_file(path, threads=100_000).threads == usable_cores()
    assert Model.from_file(path).threads == "auto"
    with pytest.raises(ArgumentError, match="expected threads of at least 1"):
        Model.from_file(path, threads=0)


def test_kv_split_follows_the_threads_unless_given(tmp_path: Path) -> None:
    """The llama.cpp thread count whose split-KV bits the C blocks give: the threads when a number, else the
    default thread count; a count out of range is refused before the file is read."""
    from minillama.model import DEFAULT_THREADS

    path = write_tiny(tmp_path / "tiny.gguf")
    assert Model.from_file(path, threads=1).kv_split == 1
    assert Model.from_file(path).kv_split == DEFAULT_THREADS
    assert Model.from_file(path, threads=1, kv_split=8).kv_split == 8
    for bad in (0, 5000, 2.0, True):
        with pytest.raises(ArgumentError, match="expected kv_split of 1 to 4096"):
            Model.from_file(tmp_path / "missing.gguf", kv_split=bad)


@pytest.mark.parametrize("start_idle, cost, best", [(2, {1: 1.0, 2: 6.0}, 1), (0, {1: 2.0, 2: 1.0}, 2)])
def test_auto_threads_settle_on_the_faster_choice(monkeypatch: pytest.MonkeyPatch, start_idle: int,
                                                  cost: dict[int, float], best: int) -> None:
    """Under load two BLAS threads ran 6x slower than one (1.4 against 18.5 tokens/s): "auto" must end up on the
    faster choice whichever it starts from, and lose little to trying the other."""
    from minillama.model import threads

    monkeypatch.setattr(threads, "idle_cores", lambda: start_idle)
    choice = threads._Choice(2)
    picks = []
    for _ in range(1000):
        n = choice.pick()
        picks.append(n)
        choice.record(n, cost[n])
    assert choice.best == best
    spent = sum(cost[n] for n in picks)
    assert spent <= 1.06 * 1000 * cost[best], f"tries cost {spent / (1000 * cost[best]) - 1:.1%}"


def test_batched_passes_of_each_row_count_choose_their_threads_apart(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """A server's decode passes of 1 and of 4 rows are kinds apart for "auto" threads: one choice for both compared
    a 4-row pass on two threads (14 ms) with a 1-row try on one (7.6 ms), took one thread and ran four clients' passes
    on it (a bench_serve run at 1.17x instead of 1.6x). Each row count's choice sees only its own times."""
    from minillama.model import threads
    from minillama.model.batch import Batch

    model = Model.from_file(write_tiny(tmp_path / "tiny.gguf"))
    s = [model.session(batched=True) for _ in range(2)]
    for session in s:
        session.logits_next([1, 2, 3])
    model._run_steps([4], Batch.steps([3], [s[0]._cache]))
    model._run_steps([4, 5], Batch.steps([4, 3], [s[0]._cache, s[1]._cache]))
    assert set(model._step_auto.current()) == {"1 steps", "2 steps"}

    times = {("1 steps", 1): 7.6, ("1 steps", 2): 5.5, ("4 steps", 1): 27.0, ("4 steps", 2): 14.0}
    monkeypatch.setattr(threads, "idle_cores", lambda: 2)
    clock = [0.0]
    monkeypatch.setattr(threads.time, "perf_counter", lambda: clock[0])
    on_one = {}
    for apart in (True, False):
        auto, ones = threads.AutoThreads(2, native=True, blas=False), []

        def run(kind: str, ones: list[bool] = ones) -> None:
            ones.append(threads.native_threads() == 1)
            clock[0] += times[kind, threads.native_threads()]

        for k in range(600):  # passes of 1 and 4 rows in turn
            kind = "4 steps" if k % 2 else "1 steps"
            auto.run(1, lambda kind=kind: run(kind), kind if apart else None)
        on_one[apart] = sum(ones)
    # apart, each kind runs on two threads but for its tries; together (as before) one thread won most passes
    assert on_one[True] <= 20 and on_one[False] > 300, on_one


def test_auto_threads_start_on_every_core_unless_each_look_finds_them_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """One look at /proc can catch the server's own event loop between two states (running in /proc/stat, asleep in
    its task list): a 620-token first prompt then ran on one thread of two. A kind of pass starts on one thread only
    when every look of START_LOOKS finds the cores busy."""
    from minillama.model import threads

    looks = iter([1, 2])  # busy at the first look, idle at the second
    monkeypatch.setattr(threads, "idle_cores", lambda: next(looks))
    assert threads._Choice(2).best == 2
    seen = []
    monkeypatch.setattr(threads, "idle_cores", lambda: seen.append(1) or 1)  # really busy
    assert threads._Choice(2).best == 1 and len(seen) == threads.START_LOOKS


def test_auto_threads_try_more_threads_once_the_cores_are_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start on a busy machine (one thread) tries two as soon as the cores are idle, not only on the ninth pass:
    a server's session runs few prompts, and a snapshot taken while another process was ending kept every one of
    them on one thread."""
    from minillama.model import threads

    idle = [0]
    monkeypatch.setattr(threads, "idle_cores", lambda: idle[0])
    choice = threads._Choice(2)
    assert [choice.pick() for _ in range(3)] == [1, 1, 1]
    for _ in range(3):
        choice.record(1, 2.0)
    idle[0] = 2
    assert choice.pick() == 1  # the cores were seen busy a moment ago: not asked again yet
    choice.record(1, 2.0)
    choice.checked -= threads.IDLE_CHECK
    assert choice.pick() == 2
    choice.record(2, 1.0)  # faster: kept
    assert choice.best == 2 and [choice.pick() for _ in range(3)] == [2, 2, 2]
    slow = threads._Choice(2)  # two threads timed and slower: the idle cores alone do not bring them back
    slow.best, slow.other, slow.cost = 1, 2, {1: 1.0, 2: 3.0}
    assert slow.pick() == 1


def test_idle_cores_do_not_count_this_processs_own_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's event loop was busy handing over the request when its worker's first batched pass asked for idle
    cores, so every prompt ran on one thread of two: this process's runnable threads are not competitors."""
    import threading
    import time

    from minillama.model import threads

    stop = threading.Event()

    def busy() -> None:  # numpy's product releases the GIL: this thread stays runnable
        a = np.ones((256, 256), np.float32)
        while not stop.is_set():
            a @ a

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        seen = []
        for _ in range(50):
            seen.append(threads.own_running_threads())
            time.sleep(0.005)
    finally:
        stop.set()
        worker.join()
    assert max(seen) >= 2  # this thread and the busy one
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "own_running_threads", lambda: 2)
    monkeypatch.setattr(threads, "procs_running", lambda: 2)
    assert threads.idle_cores() == 2  # both running threads are this process's: both cores are free for it
    monkeypatch.setattr(threads, "procs_running", lambda: 3)
    assert threads.idle_cores() == 1  # another process's thread holds a core


def test_load_progress_bar_is_erased(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bar drawn while a model loads is cleared before the chat banner (it stayed on the terminal)."""
    import io
    import sys
    import time

    from minillama import cli

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    def slow_load(path, progress=None, threads=None):
        for done in (100, 500, 1000):
            progress(done, 1000)
            time.sleep(0.6)  # past the bar's 0.5 s delay: it is drawn
        return "model"

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(Model, "from_file", staticmethod(slow_load))
    cli._load_model("model.gguf")
    text = err.getvalue()
    assert "loading model.gguf" in text  # it was drawn
    assert text.rsplit("\r", 2)[-2].strip() == "" or text.rsplit("\r", 1)[-1].strip() == "", repr(text[-300:])
